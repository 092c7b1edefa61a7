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
