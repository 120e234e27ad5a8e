#!/usr/bin/env bash
# Download a Wikipedia "pages-articles" XML dump (bz2, ~20+ GiB for English).
#
# Usage: scripts/wikipedia/download.sh [OUT_DIR]
#   WIKI_LANG   language code (default: en)       -> enwiki
#   WIKI_DATE   dump date YYYYMMDD or "latest"     (default: latest)
#   WIKI_MIRROR base URL of a dumps mirror         (default: https://dumps.wikimedia.org)
#
# A dated dump (e.g. WIKI_DATE=20200101, the one MLPerf BERT used, if the mirror still has it)
# is reproducible and is verified against the dump's published sha1sums; "latest" moves over
# time and is not verified. Downloads resume if interrupted (re-run the same command).
set -euo pipefail

OUT_DIR=${1:-data/wikipedia}
WIKI_LANG=${WIKI_LANG:-en}
WIKI_DATE=${WIKI_DATE:-latest}
WIKI_MIRROR=${WIKI_MIRROR:-https://dumps.wikimedia.org}

WIKI="${WIKI_LANG}wiki"
FILE="${WIKI}-${WIKI_DATE}-pages-articles.xml.bz2"
BASE="${WIKI_MIRROR%/}/${WIKI}/${WIKI_DATE}"

fetch() {  # fetch URL DEST (resumable)
    if command -v wget >/dev/null 2>&1; then
        wget --continue --tries=5 --progress=dot:giga -O "$2" "$1"
    elif command -v curl >/dev/null 2>&1; then
        curl --fail --location --retry 5 --continue-at - --output "$2" "$1"
    else
        echo "download.sh: neither wget nor curl is installed; install one of them." >&2
        exit 1
    fi
}

mkdir -p "$OUT_DIR"
echo "downloading ${BASE}/${FILE} -> ${OUT_DIR}/${FILE}"
fetch "${BASE}/${FILE}" "${OUT_DIR}/${FILE}"

if [[ "$WIKI_DATE" != "latest" ]]; then
    SUMS="${WIKI}-${WIKI_DATE}-sha1sums.txt"
    fetch "${BASE}/${SUMS}" "${OUT_DIR}/${SUMS}"
    (cd "$OUT_DIR" && grep " ${FILE}\$" "$SUMS" | sha1sum --check --strict -)
else
    echo "WIKI_DATE=latest: skipping the checksum (set WIKI_DATE=YYYYMMDD for a verified, reproducible dump)."
fi
echo "done: ${OUT_DIR}/${FILE}"
