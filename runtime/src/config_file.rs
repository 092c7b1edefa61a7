//! Reading a program's TOML config file.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// Why a config file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path} is invalid: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
}

/// Reads and parses the TOML file at `path`; a parse error names the line
/// and column.
pub fn read_toml<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
        path: path.to_owned(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigFileError::Parse {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct Settings {
        interval: Option<String>,
    }

    #[test]
    fn reads_toml_and_names_the_file_in_errors() {
        let dir = std::env::temp_dir().join(format!("gputel-runtime-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let good = dir.join("good.toml");
        std::fs::write(&good, "interval = \"5s\"\n").expect("write");
        let read: Settings = read_toml(&good).expect("valid file");
        assert_eq!(read.interval.as_deref(), Some("5s"));

        let bad = dir.join("bad.toml");
        std::fs::write(&bad, "interval = \n").expect("write");
        let e = read_toml::<Settings>(&bad).expect_err("invalid file");
        assert!(
            e.to_string()
                .starts_with(&format!("config file {} is invalid: ", bad.display())),
            "{e}"
        );
        let missing = dir.join("missing.toml");
        let e = read_toml::<Settings>(&missing).expect_err("missing file");
        assert!(
            e.to_string()
                .starts_with(&format!("cannot read config file {}: ", missing.display())),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
