# Sourced by the peer-venv scripts (rectools.sh, translate.sh). Expects VENV and PYTHON; sets TORCH (our pin) and
# PIP. torch goes first, through our constraints, so pip takes the CPU wheel; peers then repeat "$TORCH".
TORCH=$(grep -E '^torch==' constraints.txt)

peer_venv_start() {
    test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
    PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
    "${PIP[@]}" -c constraints.txt "$TORCH"
}

check_torch_pin() {  # fail when a peer's requirements replaced our torch pin
    local got
    got=$("$VENV/bin/python" -m pip show torch | sed -n 's/^Version: //p')
    [[ "$got" == "${TORCH#torch==}"* ]] || { echo "error: $VENV has torch $got, expected ${TORCH#torch==}" >&2; exit 1; }
}
