//! The fake library serves a converted `nvidia-smi -q -x` capture through
//! the NVML calls nvidia-smi itself made for it: checked through
//! `nvml-wrapper` for the readings the agent keeps no column for (graphics
//! and video clocks, encoder and decoder utilization) and the MIG calls.
//! The expected values are read from the XML by this test.
//!
//! One test: the scenario is chosen by an environment variable read at init.

use std::path::Path;

use gputel_fake_nvml::{SCENARIO_ENV, nvsmi};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::error::NvmlError;
use roxmltree::{Document, Node, ParsingOptions};

/// The number an element states (`"1275 MHz"` → 1275); None for N/A.
fn num(node: Node<'_, '_>, path: &str) -> Option<u32> {
    let mut n = node;
    for name in path.split('/') {
        n = n.children().find(|c| c.has_tag_name(name))?;
    }
    n.text()?.split_whitespace().next()?.parse().ok()
}

/// A reading through nvml-wrapper as the XML would state it: None for
/// "not supported".
fn value<T>(r: Result<T, NvmlError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(NvmlError::NotSupported) => None,
        Err(e) => panic!("unexpected NVML error {e}"),
    }
}

fn check(lib: &Path, capture: &Path, scenario: &Path) -> usize {
    let xml = std::fs::read_to_string(capture).expect("read capture");
    std::fs::write(scenario, nvsmi::convert(&xml).expect("convert")).expect("write");
    // SAFETY: this file holds a single test, so no other thread touches the
    // environment meanwhile.
    unsafe { std::env::set_var(SCENARIO_ENV, scenario) };
    let options = ParsingOptions {
        allow_dtd: true,
        ..ParsingOptions::default()
    };
    let doc = Document::parse_with_options(&xml, options).expect("XML");
    let nvml = Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .expect("init");
    let gpus: Vec<Node> = doc
        .root_element()
        .children()
        .filter(|n| n.has_tag_name("gpu"))
        .collect();
    assert_eq!(nvml.device_count().expect("count") as usize, gpus.len());
    for (i, gpu) in gpus.iter().enumerate() {
        let at = format!("{} GPU {i}", capture.display());
        let device = nvml.device_by_index(i as u32).expect("device");
        let got = [
            value(device.clock_info(Clock::Graphics)),
            value(device.clock_info(Clock::Video)),
            value(device.encoder_utilization()).map(|u| u.utilization),
            value(device.decoder_utilization()).map(|u| u.utilization),
        ];
        let want = [
            num(*gpu, "clocks/graphics_clock"),
            num(*gpu, "clocks/video_clock"),
            num(*gpu, "utilization/encoder_util"),
            num(*gpu, "utilization/decoder_util"),
        ];
        assert_eq!(got, want, "{at}: graphics, video clock, encoder, decoder");
        let migs: Vec<Node> = gpu
            .descendants()
            .filter(|n| n.has_tag_name("mig_device"))
            .collect();
        for (slot, m) in migs.iter().enumerate() {
            let mig = device.mig_device_by_index(slot as u32).expect("MIG device");
            assert!(mig.mig_is_mig_device_handle().expect("is MIG"));
            let memory = mig.memory_info().expect("MIG memory");
            let mib = |path: &str| num(*m, path).map(|v| u64::from(v) << 20);
            assert_eq!(
                [Some(memory.total), Some(memory.used), Some(memory.free)],
                [
                    mib("fb_memory_usage/total"),
                    mib("fb_memory_usage/used"),
                    mib("fb_memory_usage/free")
                ],
                "{at}: MIG device {slot}"
            );
            let parent = mig.mig_parent_device().expect("parent");
            assert_eq!(parent.index().expect("index"), i as u32);
        }
        // Past the last MIG device: NVML's "not found".
        if !migs.is_empty() {
            assert!(matches!(
                device.mig_device_by_index(migs.len() as u32),
                Err(NvmlError::NotFound)
            ));
        }
    }
    nvml.shutdown().expect("shutdown");
    gpus.len()
}

#[test]
fn converted_captures_answer_nvml_calls_with_the_captured_values() {
    let lib = gputel_fake_nvml::cdylib_path().expect("the fake library next to this test");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/nvidia-smi");
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("captures")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "xml"))
        .collect();
    files.sort();
    let gpus: usize = files
        .iter()
        .map(|f| check(&lib, f, &tmp.path().join("scenario.toml")))
        .sum();
    assert_eq!((files.len(), gpus), (9, 16));
}
