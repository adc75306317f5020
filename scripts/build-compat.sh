#!/usr/bin/env bash
# Builds the previous release's mirrorguard binary for the mixed-version test
# (tests/integration/test_mixed_version.py): a pinned commit of this repository's own
# history, taken with `git archive` (no network), built in the dev profile with this
# checkout's cargo target directory so that its compiled dependencies are reused (the
# release's Cargo.lock pins the same crates: only the mirrorguard crate itself compiles).
# The binary is renamed in the archived Cargo.toml (mirrorguard-compat-<rev>) so the build
# never replaces target/debug/mirrorguard, and installed as
#   $MG_COMPAT_DIR/<rev>/mirrorguard      (MG_COMPAT_DIR defaults to .tools/compat)
# Idempotent: an installed binary is kept. Without the commit in the clone's history (a
# shallow clone) nothing is built and the test skips, saying why.
set -euo pipefail
cd "$(dirname "$0")/.."

# The previous release: what landed at the last stop (issue 17's first handover step).
COMPAT_REV="d7c900a30b9d9bee931aedf554f6eae9ecde024c"
COMPAT_DIR="${MG_COMPAT_DIR:-$PWD/.tools/compat}/$COMPAT_REV"
TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
BIN_NAME="mirrorguard-compat-${COMPAT_REV:0:12}"

if [ -x "$COMPAT_DIR/mirrorguard" ]; then
  exit 0
fi
if ! git cat-file -e "${COMPAT_REV}^{commit}" 2>/dev/null; then
  echo "build-compat: commit $COMPAT_REV is not in this clone's history (shallow clone?):" \
    "the mixed-version test will skip" >&2
  exit 0
fi
src="$(mktemp -d)"
trap 'rm -rf "$src"' EXIT
git archive "$COMPAT_REV" | tar -x -C "$src"
python3 - "$src/Cargo.toml" "$BIN_NAME" <<'PY'
import re, sys
path, name = sys.argv[1], sys.argv[2]
text = open(path).read()
new, n = re.subn(r'(\[\[bin\]\]\s*\nname\s*=\s*)"mirrorguard"', r'\1"%s"' % name, text, count=1)
if n != 1:
    sys.exit("build-compat: no [[bin]] named mirrorguard in the release's Cargo.toml")
# This checkout's dev profile, so the compiled dependencies are the same artifacts.
profiles = re.findall(r'^\[profile\.dev[\].][^\n]*\n(?:[^\[\n][^\n]*\n|\n)*', open("Cargo.toml").read(), re.M)
if "[profile.dev" in new:
    sys.exit("build-compat: the release's Cargo.toml has a dev profile of its own")
open(path, "w").write(new + "\n" + "".join(profiles))
PY
# Non-incremental (a one-off build: no incremental cache left behind); the JSON messages
# name the release's own artifacts, deleted once the binary is installed (its compiled
# dependencies stay: they are this checkout's too).
CARGO_INCREMENTAL=0 cargo build -q --locked --bins --manifest-path "$src/Cargo.toml" \
  --target-dir "$TARGET_DIR" --message-format=json-render-diagnostics > "$src/messages.json"
mkdir -p "$COMPAT_DIR"
# Debug info stripped (symbols kept for backtraces): ~30 MB instead of ~140 MB.
if command -v strip >/dev/null; then
  strip --strip-debug -o "$COMPAT_DIR/mirrorguard.tmp" "$TARGET_DIR/debug/$BIN_NAME"
else
  cp "$TARGET_DIR/debug/$BIN_NAME" "$COMPAT_DIR/mirrorguard.tmp"
fi
chmod 0755 "$COMPAT_DIR/mirrorguard.tmp"
mv "$COMPAT_DIR/mirrorguard.tmp" "$COMPAT_DIR/mirrorguard"
python3 - "$src" "$src/messages.json" <<'PY'
import json, os, sys
src, messages = sys.argv[1], sys.argv[2]
for line in open(messages):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or src not in (m.get("manifest_path") or ""):
        continue
    for f in m.get("filenames", []):
        # deps/<name>-<hash>.<ext>: every file of that unit (rlib, rmeta, .d).
        stem = os.path.basename(f).split(".")[0]
        if os.path.dirname(f).endswith("deps") and "-" in stem:
            unit = stem.rsplit("-", 1)[1]
            for g in os.listdir(os.path.dirname(f)):
                if "-" + unit + "." in g or g.endswith("-" + unit):
                    os.remove(os.path.join(os.path.dirname(f), g))
PY
rm -f "$TARGET_DIR/debug/$BIN_NAME" "$TARGET_DIR/debug/$BIN_NAME.d" \
  "$TARGET_DIR/debug/deps/${BIN_NAME//-/_}"-*
echo "$COMPAT_REV" > "$COMPAT_DIR/REVISION"
