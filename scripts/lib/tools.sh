# Shared by scripts/test and scripts/run-local: finds or installs the tools
# the project uses beside cargo. Installs go under target/tools, never system-wide
# unless a system package is missing (then apt-get, as root only).

tools_dir="$(pwd)/target/tools"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# A Python virtual environment under target/tools/venv, made on first use.
ensure_venv() {
  local venv="$tools_dir/venv"
  if [[ ! -x $venv/bin/pip ]]; then
    say "creating a Python environment for test tools in $venv"
    if ! python3 -m venv "$venv" 2>/dev/null; then
      if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
        python3 -m venv "$venv"
      else
        die "python3 -m venv failed: install Python 3 with venv (Debian: apt-get install python3-venv)"
      fi
    fi
  fi
  VENV_BIN="$venv/bin"
}

# Sets DUCKDB to the DuckDB CLI: $GPUTEL_DUCKDB when it runs, else one on
# PATH, else PyPI's duckdb-cli in the venv.
ensure_duckdb() {
  if [[ -n ${GPUTEL_DUCKDB:-} ]] && "$GPUTEL_DUCKDB" -version >/dev/null 2>&1; then
    DUCKDB=$GPUTEL_DUCKDB
  elif command -v duckdb >/dev/null && duckdb -version >/dev/null 2>&1; then
    DUCKDB=$(command -v duckdb)
  else
    ensure_venv
    if [[ ! -x $VENV_BIN/duckdb ]]; then
      say "installing the DuckDB CLI (PyPI: duckdb-cli)"
      "$VENV_BIN/pip" install --quiet --disable-pip-version-check duckdb-cli \
        || die "could not install duckdb-cli from PyPI; install the DuckDB CLI and put it on PATH"
    fi
    DUCKDB="$VENV_BIN/duckdb"
  fi
  "$DUCKDB" -version >/dev/null 2>&1 || die "the DuckDB CLI at $DUCKDB does not run"
  export GPUTEL_DUCKDB="$DUCKDB"
}

# Unpacks MEMBERs (paths as `./usr/bin/x`) of Debian's package PACKAGE
# into DIR, without installing it (installing some would also enable and
# start a service); WHAT names the tool in messages, ON_PATH what to put on
# PATH instead. Refreshes the package lists once, as root, when they are
# stale.
deb_unpack() {
  local package=$1 dir=$2 what=$3 on_path=$4
  shift 4
  command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
    || die "$what is not installed: install it and put $on_path on PATH (Debian: apt-get install $package)"
  say "installing $what (Debian package $package, unpacked in $dir)"
  local deb_dir
  deb_dir=$(mktemp -d)
  if ! (cd "$deb_dir" && apt-get download -qq "$package" >/dev/null 2>&1); then
    if [[ $(id -u) != 0 ]]; then
      rm -rf "$deb_dir"
      die "$what is not installed and apt-get cannot download the Debian package $package (stale package lists?): run 'apt-get update' as root, or install $on_path and put it on PATH"
    fi
    apt-get update -qq >/dev/null
    (cd "$deb_dir" && apt-get download -qq "$package" >/dev/null 2>&1) || {
      rm -rf "$deb_dir"
      die "apt-get could not download the Debian package $package; install $on_path and put it on PATH"
    }
  fi
  mkdir -p "$dir"
  dpkg-deb --fsys-tarfile "$deb_dir/${package}"_*.deb | tar -x -C "$dir" "$@" || {
    rm -rf "$deb_dir"
    die "could not unpack $what from the Debian package $package"
  }
  rm -rf "$deb_dir"
}

# Sets GPUTEL_PROMTOOL to Prometheus' promtool: one on PATH, else the one in
# Debian's prometheus package, unpacked under target/tools. (Installing that
# package would also enable and start a Prometheus server on port 9090.)
ensure_promtool() {
  local promtool dir="$tools_dir/prometheus"
  if command -v promtool >/dev/null && promtool --version >/dev/null 2>&1; then
    promtool=$(command -v promtool)
  else
    promtool="$dir/usr/bin/promtool"
    if [[ ! -x $promtool ]]; then
      deb_unpack prometheus "$dir" promtool promtool ./usr/bin/promtool
    fi
  fi
  "$promtool" --version >/dev/null 2>&1 || die "promtool at $promtool does not run"
  export GPUTEL_PROMTOOL="$promtool"
}

# Puts cargo-fuzz (a pinned version, built from crates.io into target/tools)
# on PATH.
CARGO_FUZZ_VERSION=0.13.2
ensure_cargo_fuzz() {
  local root="$tools_dir/cargo-fuzz"
  if [[ ! -x $root/bin/cargo-fuzz ]] || [[ $("$root/bin/cargo-fuzz" --version) != *"$CARGO_FUZZ_VERSION"* ]]; then
    say "installing cargo-fuzz $CARGO_FUZZ_VERSION (crates.io) into $root"
    cargo install --quiet --locked --root "$root" cargo-fuzz --version "$CARGO_FUZZ_VERSION" \
      || die "could not install cargo-fuzz $CARGO_FUZZ_VERSION from crates.io"
  fi
  export PATH="$root/bin:$PATH"
}

# Sets GPUTEL_S3_SERVER to an S3-compatible server for the object-store tests:
# moto's server mode (PyPI: moto[server]) in the venv. Pure Python, starts in
# about a second, keeps objects in memory, and speaks the S3 REST API that
# object_store's S3 client uses (ListObjectsV2, multipart, conditional GET).
ensure_s3_server() {
  ensure_venv
  if [[ ! -x $VENV_BIN/moto_server ]]; then
    say "installing an S3-compatible test server (PyPI: moto[server])"
    "$VENV_BIN/pip" install --quiet --disable-pip-version-check 'moto[server]' \
      || die "could not install moto[server] from PyPI; install it and set GPUTEL_S3_SERVER to its moto_server"
  fi
  "$VENV_BIN/moto_server" --help >/dev/null 2>&1 || die "the S3 test server at $VENV_BIN/moto_server does not run"
  export GPUTEL_S3_SERVER="$VENV_BIN/moto_server"
}

# Sets GPUTEL_KUBE_VALIDATE to kubernetes-validate (PyPI), pinned: it checks
# deploy/kubernetes against the Kubernetes API's published OpenAPI schemas,
# which it carries, so no cluster is needed.
KUBE_VALIDATE_VERSION=1.37.0
ensure_kube_validate() {
  ensure_venv
  if [[ $("$VENV_BIN/kubernetes-validate" --version 2>/dev/null) != "$KUBE_VALIDATE_VERSION" ]]; then
    say "installing kubernetes-validate $KUBE_VALIDATE_VERSION (PyPI)"
    "$VENV_BIN/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$KUBE_VALIDATE_VERSION" \
      || die "could not install kubernetes-validate from PyPI; install it and set GPUTEL_KUBE_VALIDATE to it"
  fi
  export GPUTEL_KUBE_VALIDATE="$VENV_BIN/kubernetes-validate"
}

# Sets CARGO_DEB to cargo-deb (crates.io), pinned, installed under
# target/tools/bin on first use (about a minute of compiling).
CARGO_DEB_VERSION=3.8.0
ensure_cargo_deb() {
  local bin="$tools_dir/bin/cargo-deb"
  if [[ $("$bin" --version 2>/dev/null) != "cargo-deb $CARGO_DEB_VERSION" ]]; then
    say "installing cargo-deb $CARGO_DEB_VERSION into $tools_dir"
    cargo install --quiet --locked --root "$tools_dir" cargo-deb --version "$CARGO_DEB_VERSION" \
      || die "could not install cargo-deb $CARGO_DEB_VERSION from crates.io (cargo install cargo-deb)"
  fi
  command -v dpkg-deb >/dev/null \
    || die "dpkg-deb is missing: it lists and checks the packages (Debian: apt-get install dpkg)"
  CARGO_DEB=$bin
}

# Sets LLVM_PROFDATA to the llvm-profdata of rustc's own LLVM, which merges
# the counts of a profile-guided build's training run (scripts/package):
# rustup's llvm-tools component, added on first use. Another LLVM's
# llvm-profdata may not read the raw profiles rustc's LLVM writes.
ensure_llvm_profdata() {
  local sysroot host
  sysroot=$(rustc --print sysroot)
  host=$(rustc -vV | sed -n 's/^host: //p')
  LLVM_PROFDATA="$sysroot/lib/rustlib/$host/bin/llvm-profdata"
  if [[ ! -x $LLVM_PROFDATA ]]; then
    command -v rustup >/dev/null \
      || die "llvm-profdata of rustc's LLVM is missing and rustup is not here to add it (rustup component add llvm-tools); or package with --no-pgo"
    say "adding rustup's llvm-tools component (llvm-profdata, for the profile-guided build)"
    rustup component add llvm-tools \
      || die "could not add rustup's llvm-tools component; or package with --no-pgo"
  fi
  [[ -x $LLVM_PROFDATA ]] || die "no llvm-profdata at $LLVM_PROFDATA after adding llvm-tools"
}

# Sets GPUTEL_SYSTEMD_ANALYZE to systemd-analyze, which checks the unit files.
# Where systemd is missing (a container whose PID 1 is not systemd), Debian's
# systemd package is installed as root: without a running systemd its
# installation starts nothing.
ensure_systemd_analyze() {
  if ! command -v systemd-analyze >/dev/null; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null && [[ ! -d /run/systemd/system ]]; then
      say "installing systemd-analyze (Debian package systemd; nothing is started)"
      { apt-get install -y -qq --no-install-recommends systemd >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends systemd >/dev/null; }; } \
        || die "apt-get could not install the Debian package systemd; install systemd-analyze and put it on PATH"
    else
      die "systemd-analyze is missing: install systemd (Debian: apt-get install systemd) and put it on PATH"
    fi
  fi
  export GPUTEL_SYSTEMD_ANALYZE
  GPUTEL_SYSTEMD_ANALYZE=$(command -v systemd-analyze)
}

# Sets GPUTEL_ALERTMANAGER to Prometheus' Alertmanager: one on PATH, else the
# one in Debian's prometheus-alertmanager package, unpacked under target/tools
# (installing the package would also enable and start the service).
ensure_alertmanager() {
  local alertmanager dir="$tools_dir/alertmanager"
  if command -v alertmanager >/dev/null && alertmanager --version >/dev/null 2>&1; then
    alertmanager=$(command -v alertmanager)
  elif command -v prometheus-alertmanager >/dev/null && prometheus-alertmanager --version >/dev/null 2>&1; then
    alertmanager=$(command -v prometheus-alertmanager)
  else
    if [[ ! -x $dir/alertmanager ]]; then
      deb_unpack prometheus-alertmanager "$dir" Alertmanager alertmanager \
        ./usr/bin/prometheus-alertmanager ./usr/share/prometheus/alertmanager
      # Debian's build reads its notification templates from the absolute
      # /usr/share/prometheus/alertmanager and stops without them. Point the
      # unpacked copy at its own: the path becomes relative (same length,
      # so the binary stays intact), and a wrapper runs it from $dir.
      python3 - "$dir/usr/bin/prometheus-alertmanager" <<'PY' || die "could not adapt the unpacked Alertmanager"
import sys
path = sys.argv[1]
data = open(path, "rb").read()
old, new = b"/usr/share/prometheus/alertmanager", b"usr/share/prometheus/alertmanager/"
assert len(old) == len(new) and old in data, "template path not found"
open(path, "wb").write(data.replace(old, new))
PY
      printf '#!/bin/sh\n# Runs the unpacked Alertmanager next to its templates.\ncd "$(dirname "$0")" && exec ./usr/bin/prometheus-alertmanager "$@"\n' > "$dir/alertmanager"
      chmod +x "$dir/alertmanager"
    fi
    alertmanager="$dir/alertmanager"
  fi
  "$alertmanager" --version >/dev/null 2>&1 || die "Alertmanager at $alertmanager does not run"
  export GPUTEL_ALERTMANAGER="$alertmanager"
}

# Sets GPUTEL_NODE_EXPORTER to Prometheus' node_exporter: one on PATH
# (node_exporter, or Debian's prometheus-node-exporter), else the one in
# Debian's prometheus-node-exporter package, unpacked under target/tools
# (installing the package would also enable and start the service on port
# 9100). tests/tests/node_exporter.rs runs it on the captured sysfs trees.
ensure_node_exporter() {
  local node_exporter dir="$tools_dir/node_exporter"
  if command -v node_exporter >/dev/null && node_exporter --version >/dev/null 2>&1; then
    node_exporter=$(command -v node_exporter)
  elif command -v prometheus-node-exporter >/dev/null && prometheus-node-exporter --version >/dev/null 2>&1; then
    node_exporter=$(command -v prometheus-node-exporter)
  else
    node_exporter="$dir/usr/bin/prometheus-node-exporter"
    if [[ ! -x $node_exporter ]]; then
      deb_unpack prometheus-node-exporter "$dir" node_exporter node_exporter \
        ./usr/bin/prometheus-node-exporter
    fi
  fi
  "$node_exporter" --version >/dev/null 2>&1 || die "node_exporter at $node_exporter does not run"
  export GPUTEL_NODE_EXPORTER="$node_exporter"
}

# Sets GPUTEL_NGINX to nginx: one on PATH, else the binary of Debian's nginx
# package, unpacked under target/tools. benches/scripts/metrics-scrape.sh
# serves the agent's own page from it, as the floor a scrape costs: what a
# C web server pays to send the same cached bytes.
ensure_nginx() {
  local nginx dir="$tools_dir/nginx"
  if command -v nginx >/dev/null && nginx -v >/dev/null 2>&1; then
    nginx=$(command -v nginx)
  else
    nginx="$dir/usr/sbin/nginx"
    [[ -x $nginx ]] || deb_unpack nginx "$dir" nginx nginx ./usr/sbin/nginx
  fi
  "$nginx" -v >/dev/null 2>&1 || die "nginx at $nginx does not run"
  export GPUTEL_NGINX="$nginx"
}

# Sets GPUTEL_CHROMIUM to a headless-capable Chromium: one on PATH, else
# Debian's chromium package, installed as root (the report test opens the
# fleet report in it).
ensure_chromium() {
  local chromium
  chromium=$(command -v chromium || command -v chromium-browser || true)
  if [[ -z $chromium ]]; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
      say "installing Chromium (Debian package chromium)"
      { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null \
             && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }; } \
        || die "apt-get could not install the Debian package chromium; install Chromium and put chromium on PATH"
      chromium=$(command -v chromium)
    else
      die "Chromium is missing: install it (Debian: apt-get install chromium) and put chromium on PATH"
    fi
  fi
  "$chromium" --headless --no-sandbox --version >/dev/null 2>&1 || die "Chromium at $chromium does not run"
  export GPUTEL_CHROMIUM="$chromium"
}

# Sets GPUTEL_SPARK to a Python with Apache Spark (PyPI: pyspark, pinned,
# in the venv; it runs in local mode on a Java 17 runtime, from Debian's
# openjdk-17-jre-headless where none is installed) and GPUTEL_SPARK_JARS to
# the jars Spark needs for s3a:// (hadoop-aws and the AWS SDK bundle it was
# built with). Maven Central, where Spark would fetch them, is not needed:
# PyPI's sagemaker_pyspark carries hadoop-aws 3.3.1 and aws-java-sdk-bundle
# 1.11.901 (Hadoop 3.3.1's own SDK version), which work with the Hadoop
# 3.3.4 client that pyspark 3.5 bundles; only those two jars are unpacked,
# checked against pinned SHA-256 sums, into target/tools/spark-jars.
# pyspark 4 bundles Hadoop 3.4 or newer, whose S3A needs the AWS SDK v2
# bundle, which no PyPI package carries: hence pyspark 3.5.
PYSPARK_VERSION=3.5.9
SAGEMAKER_PYSPARK_VERSION=1.4.5
S3A_JARS_SHA256="6be50ad8a8b445d2802381b085b2a3ede5c29d353450a6a21f16b2fefa962b6e  hadoop-aws-3.3.1.jar
b87175b32a16544cc1b37cf40390eb375833e62bed67f8ce6cde4b7ad6429ead  aws-java-sdk-bundle-1.11.901.jar"
ensure_spark() {
  if ! command -v java >/dev/null || ! java -version 2>&1 | grep -q 'version "\(1[7-9]\|2[0-9]\)'; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
      say "installing a Java runtime for Spark (Debian package openjdk-17-jre-headless)"
      { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null \
             && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless >/dev/null; }; } \
        || die "apt-get could not install the Debian package openjdk-17-jre-headless; install Java 17 and put java on PATH"
    else
      die "Spark needs Java 17 or newer: install it (Debian: apt-get install openjdk-17-jre-headless) and put java on PATH"
    fi
  fi
  ensure_venv
  if [[ $("$VENV_BIN/python" -c 'import pyspark; print(pyspark.__version__)' 2>/dev/null) != "$PYSPARK_VERSION" ]]; then
    say "installing Apache Spark $PYSPARK_VERSION (PyPI: pyspark, about 320 MB)"
    "$VENV_BIN/pip" install --quiet --disable-pip-version-check "pyspark==$PYSPARK_VERSION" \
      || die "could not install pyspark $PYSPARK_VERSION from PyPI"
  fi
  local jars="$tools_dir/spark-jars"
  if ! (cd "$jars" 2>/dev/null && sha256sum --quiet -c - <<<"$S3A_JARS_SHA256" >/dev/null 2>&1); then
    say "installing Spark's S3A jars (hadoop-aws 3.3.1, aws-java-sdk-bundle 1.11.901; from PyPI's sagemaker_pyspark $SAGEMAKER_PYSPARK_VERSION)"
    local dl
    dl=$(mktemp -d)
    "$VENV_BIN/pip" download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
      -d "$dl" "sagemaker_pyspark==$SAGEMAKER_PYSPARK_VERSION" \
      || { rm -rf "$dl"; die "could not download sagemaker_pyspark $SAGEMAKER_PYSPARK_VERSION from PyPI (it carries Spark's S3A jars)"; }
    mkdir -p "$jars"
    tar -xzf "$dl"/sagemaker_pyspark-*.tar.gz -C "$jars" --strip-components=3 --wildcards \
      '*/deps/jars/hadoop-aws-3.3.1.jar' '*/deps/jars/aws-java-sdk-bundle-1.11.901.jar' \
      || { rm -rf "$dl"; die "could not unpack the S3A jars from sagemaker_pyspark"; }
    rm -rf "$dl"
    (cd "$jars" && sha256sum --quiet -c - <<<"$S3A_JARS_SHA256") \
      || die "the S3A jars unpacked from sagemaker_pyspark do not match their pinned SHA-256 sums"
  fi
  "$VENV_BIN/python" -c 'import pyspark' 2>/dev/null || die "pyspark does not import in $VENV_BIN/python"
  export GPUTEL_SPARK="$VENV_BIN/python"
  export GPUTEL_SPARK_JARS="$jars/hadoop-aws-3.3.1.jar,$jars/aws-java-sdk-bundle-1.11.901.jar"
}
