#!/usr/bin/env bash
# Extract plain text from a Wikipedia XML dump with WikiExtractor (pip install "omnibert[wiki]").
#
# Usage: scripts/wikipedia/extract.sh DUMP.xml.bz2 [OUT_DIR] [extra WikiExtractor flags...]
#   PROCESSES   worker processes (default: all CPUs)
#   FILE_SIZE   bytes per output file, WikiExtractor's -b (default: 16M; fewer, larger files
#               mean fewer tasks for preprocess.py, whose memory grows with file size)
#   COMPRESS=1  write wiki_NN.bz2 files (preprocess.py reads both)
#   PYTHON      interpreter with wikiextractor>=3.1 installed (default: python)
#
# Output: OUT_DIR/AA/wiki_00, OUT_DIR/AA/wiki_01, ... in WikiExtractor's default <doc> format
# (not --json, not --text: preprocess.py needs the <doc id=.. url=.. title=..> headers), with
# the default --html-safe kept so that article text can never close a </doc> early.
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: $0 DUMP.xml.bz2 [OUT_DIR] [extra WikiExtractor flags...]" >&2
    exit 2
fi
DUMP=$1
OUT_DIR=${2:-data/wikipedia/extracted}
shift $(( $# >= 2 ? 2 : 1 ))
PROCESSES=${PROCESSES:-$(nproc)}
FILE_SIZE=${FILE_SIZE:-16M}
PYTHON=${PYTHON:-python}

if [[ ! -f "$DUMP" ]]; then
    echo "extract.sh: dump $DUMP does not exist; run scripts/wikipedia/download.sh first." >&2
    exit 1
fi
# wikiextractor 3.0.x loses the last article(s) of the extraction when writing files
# (upstream issue #284) and crashes with --compress; 3.1.0 fixes both.
if ! "$PYTHON" - <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version

try:
    found = version("wikiextractor")
except PackageNotFoundError:
    sys.exit("extract.sh: wikiextractor is not installed; run: pip install 'omnibert[wiki]'")
major_minor = tuple(int(part) for part in found.split(".")[:2])
if major_minor < (3, 1):
    sys.exit(
        f"extract.sh: wikiextractor {found} drops the last articles of its output; "
        "run: pip install 'wikiextractor>=3.1,<3.2'"
    )
PY
then
    exit 1
fi

FLAGS=(--output "$OUT_DIR" --bytes "$FILE_SIZE" --processes "$PROCESSES")
if [[ "${COMPRESS:-0}" == "1" ]]; then
    FLAGS+=(--compress)
fi

mkdir -p "$OUT_DIR"
echo "extracting $DUMP -> $OUT_DIR (${PROCESSES} processes, ${FILE_SIZE} per file)"
"$PYTHON" -m wikiextractor.WikiExtractor "${FLAGS[@]}" "$@" "$DUMP"
echo "done: $(find "$OUT_DIR" -type f -name 'wiki_*' | wc -l) files in $OUT_DIR"
