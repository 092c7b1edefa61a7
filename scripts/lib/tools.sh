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

# Sets DUCKDB to the DuckDB CLI: one on PATH, else PyPI's duckdb-cli in the venv.
ensure_duckdb() {
  if command -v duckdb >/dev/null && duckdb -version >/dev/null 2>&1; then
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
      command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
        || die "promtool is not installed: install Prometheus' promtool and put it on PATH (Debian: apt-get install prometheus)"
      say "installing promtool (Debian package prometheus, unpacked in $dir)"
      local deb_dir
      deb_dir=$(mktemp -d)
      if ! (cd "$deb_dir" && apt-get download -qq prometheus >/dev/null 2>&1); then
        if [[ $(id -u) != 0 ]]; then
          rm -rf "$deb_dir"
          die "promtool is not installed and apt-get cannot download the Debian package prometheus (stale package lists?): run 'apt-get update' as root, or install promtool and put it on PATH"
        fi
        apt-get update -qq >/dev/null
        (cd "$deb_dir" && apt-get download -qq prometheus >/dev/null 2>&1) || {
          rm -rf "$deb_dir"
          die "apt-get could not download the Debian package prometheus; install promtool and put it on PATH"
        }
      fi
      mkdir -p "$dir"
      dpkg-deb --fsys-tarfile "$deb_dir"/prometheus_*.deb | tar -x -C "$dir" ./usr/bin/promtool || {
        rm -rf "$deb_dir"
        die "could not unpack promtool from the Debian package prometheus"
      }
      rm -rf "$deb_dir"
    fi
  fi
  "$promtool" --version >/dev/null 2>&1 || die "promtool at $promtool does not run"
  export GPUTEL_PROMTOOL="$promtool"
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
      command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
        || die "Alertmanager is not installed: install it and put alertmanager on PATH (Debian: apt-get install prometheus-alertmanager)"
      say "installing Alertmanager (Debian package prometheus-alertmanager, unpacked in $dir)"
      local deb_dir
      deb_dir=$(mktemp -d)
      if ! (cd "$deb_dir" && apt-get download -qq prometheus-alertmanager >/dev/null 2>&1); then
        if [[ $(id -u) != 0 ]]; then
          rm -rf "$deb_dir"
          die "Alertmanager is not installed and apt-get cannot download the Debian package prometheus-alertmanager (stale package lists?): run 'apt-get update' as root, or install alertmanager and put it on PATH"
        fi
        apt-get update -qq >/dev/null
        (cd "$deb_dir" && apt-get download -qq prometheus-alertmanager >/dev/null 2>&1) || {
          rm -rf "$deb_dir"
          die "apt-get could not download the Debian package prometheus-alertmanager; install alertmanager and put it on PATH"
        }
      fi
      mkdir -p "$dir"
      dpkg-deb --fsys-tarfile "$deb_dir"/prometheus-alertmanager_*.deb \
        | tar -x -C "$dir" ./usr/bin/prometheus-alertmanager ./usr/share/prometheus/alertmanager || {
        rm -rf "$deb_dir"
        die "could not unpack alertmanager from the Debian package prometheus-alertmanager"
      }
      rm -rf "$deb_dir"
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
