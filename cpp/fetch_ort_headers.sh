#!/usr/bin/env bash
# Prepare what the ONNX Runtime program builds and links against, inside the build folder only:
#
#   DEST/include/onnxruntime/   the C/C++ API headers from Debian trixie's libonnxruntime-dev
#                               (fetched with a private apt state folder; the system's apt sources,
#                               lists and cache are never touched)
#   DEST/lib/                   libonnxruntime.so and libonnxruntime.so.1 (the SONAME, which the
#                               wheel does not ship) -> the wheel's libonnxruntime.so.1.*, and the
#                               provider libraries beside them (ORT loads providers from the folder
#                               the library was loaded from)
#
# Usage: fetch_ort_headers.sh DEST PYTHON
# The headers are fetched once (skipped when DEST/include/onnxruntime holds them); the link folder
# is refreshed every run (cheap) so that it follows the venv that PYTHON belongs to.
set -euo pipefail

dest=${1:?usage: fetch_ort_headers.sh DEST PYTHON}
python=${2:?usage: fetch_ort_headers.sh DEST PYTHON}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)

die() { echo "fetch_ort_headers.sh: $*" >&2; exit 1; }

# --- headers -----------------------------------------------------------------------------------
hdr="$dest/include/onnxruntime"
if [[ ! -f "$hdr/onnxruntime_cxx_api.h" ]]; then
    command -v apt-get >/dev/null || die "apt-get not found: put the ONNX Runtime C++ headers in $hdr by hand"
    command -v dpkg >/dev/null || die "dpkg not found: put the ONNX Runtime C++ headers in $hdr by hand"
    apt_dir="$dest/apt"
    rm -rf "$apt_dir"
    mkdir -p "$apt_dir/sources" "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/deb"
    # The Debian mirror the system already uses (deb822 or one-line sources), else deb.debian.org.
    mirror=$(grep -hoE 'https?://[^ ]*/debian/?( |$)' /etc/apt/sources.list.d/*.sources \
                 /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
             | head -n1 | tr -d ' ' || true)
    mirror=${mirror:-http://deb.debian.org/debian}
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    [[ -f $keyring ]] || die "missing $keyring (package debian-archive-keyring)"
    cat > "$apt_dir/sources/trixie.sources" <<EOF
Types: deb
URIs: $mirror
Suites: trixie
Components: main
Signed-By: $keyring
EOF
    apt_opts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$apt_dir/sources"
              -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
              -o "Dir::State::status=/dev/null" -o "Debug::NoLocking=1"
              -o "APT::Sandbox::User=root" -q)
    echo "fetching libonnxruntime-dev headers (Debian trixie, private apt state in $apt_dir)"
    apt-get "${apt_opts[@]}" update >"$apt_dir/update.log" 2>&1 \
        || { tail -n 5 "$apt_dir/update.log" >&2; die "apt-get update (private state) failed"; }
    (cd "$apt_dir/deb" && apt-get "${apt_opts[@]}" download libonnxruntime-dev) >"$apt_dir/download.log" 2>&1 \
        || { tail -n 5 "$apt_dir/download.log" >&2; die "apt-get download libonnxruntime-dev failed"; }
    deb=$(ls "$apt_dir"/deb/libonnxruntime-dev_*.deb | head -n1)
    dpkg -x "$deb" "$apt_dir/x"
    src=$(dirname "$(find "$apt_dir/x" -name onnxruntime_cxx_api.h | head -n1)")
    [[ -f "$src/onnxruntime_cxx_api.h" ]] || die "$deb holds no onnxruntime_cxx_api.h"
    rm -rf "$hdr" && mkdir -p "$(dirname "$hdr")"
    cp -r "$src" "$hdr"
    basename "$deb" > "$hdr/FROM_DEB"
    rm -rf "$apt_dir"
fi

# --- link folder -------------------------------------------------------------------------------
capi=$("$python" -c 'import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), "capi"))') \
    || die "$python cannot import onnxruntime (run make setup)"
lib=$(ls "$capi"/libonnxruntime.so.1.* 2>/dev/null | head -n1)
[[ -n $lib ]] || die "no libonnxruntime.so.1.* in $capi"
mkdir -p "$dest/lib"
ln -sfn "$lib" "$dest/lib/libonnxruntime.so.1"
ln -sfn "libonnxruntime.so.1" "$dest/lib/libonnxruntime.so"
for p in "$capi"/libonnxruntime_providers_*.so; do
    [[ -e $p ]] && ln -sfn "$p" "$dest/lib/$(basename "$p")"
done
echo "$lib" > "$dest/lib/ORT_LIBRARY"
