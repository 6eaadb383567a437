#!/bin/sh
# The `flashattn` command end to end, with numpy writing the inputs and reading the outputs.
# Skipped (77) where python3 or numpy is missing; CI installs numpy.
[ -z "$FA_CROSS_BUILD" ] || { echo "cross build: the CLI tests run the host's python on native binaries: skipped"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "python3 not found: skipped"; exit 77; }
python3 -c "import numpy" 2>/dev/null || { echo "numpy not installed: skipped"; exit 77; }
exec python3 "${srcdir:-.}/tests/test_cli.py" "${top_builddir:-.}/flashattn"
