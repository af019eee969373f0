# Sourced by the peer-venv scripts (rectools.sh, translate.sh): what every peer venv shares.
# Expects VENV and PYTHON; sets TORCH (our pin, e.g. torch==2.13.0) and PIP (an install command array).

TORCH=$(grep -E '^torch==' constraints.txt)

# Create or reuse $VENV and install torch first, through our constraints, so pip takes the CPU
# wheel (not the CUDA build). Peers are installed afterwards with "$TORCH" repeated.
peer_venv_start() {
    test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
    PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
    "${PIP[@]}" -c constraints.txt "$TORCH"
}

# Fail when a peer's requirements replaced our torch pin.
check_torch_pin() {
    local got
    got=$("$VENV/bin/python" -m pip show torch | sed -n 's/^Version: //p')
    if [[ "$got" != "${TORCH#torch==}"* ]]; then
        echo "error: $VENV has torch $got, expected ${TORCH#torch==}; something replaced the pin" >&2
        exit 1
    fi
}
