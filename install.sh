#!/usr/bin/env bash
# install.sh: set up cdui in this checkout and put `cdui` on the PATH.
# Idempotent: run it again to repair, or with another --gpu to switch torch builds.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: ./install.sh [--gpu cpu|cuXXX|rocmX.Y|skip] [--wheelhouse DIR] [--s3] [--extras LIST] [--no-link]

Creates .venv in this checkout, installs cdui and PyTorch into it, and links the
launcher bin/cdui as ~/.local/bin/cdui.

  --gpu cpu          torch==2.13.0, the default (no extra package index)
  --gpu cuXXX        torch==2.13.0+cuXXX from https://download.pytorch.org/whl/cuXXX (e.g. cu128)
  --gpu rocmX.Y      torch==2.13.0+rocmX.Y from https://download.pytorch.org/whl/rocmX.Y
  --gpu skip         install no torch
  --wheelhouse DIR   install offline from DIR (made by `bin/cdui wheelhouse DIR`):
                     pip --no-index --find-links DIR
  --s3               also install boto3, for the S3 / MinIO bucket backend (docs/s3.md)
  --extras LIST      also these node-family extras: all, or a comma list (docs/install.md)
  --no-link          do not create ~/.local/bin/cdui

Environment: CODEFYUI_TORCH_SPEC (a full pip requirement for torch, used when --gpu is
absent), CODEFYUI_WHEELHOUSE (same as --wheelhouse). See docs/install.md.
EOF
}

die() { printf 'install.sh: error: %s\n' "$*" >&2; exit 1; }

gpu=""
wheelhouse=${CODEFYUI_WHEELHOUSE:-}
link=1
s3=0
extras=""
while [ $# -gt 0 ]; do
    case $1 in
        --gpu) [ $# -ge 2 ] || die "--gpu needs a value"; gpu=$2; shift 2 ;;
        --gpu=*) gpu=${1#--gpu=}; shift ;;
        --wheelhouse) [ $# -ge 2 ] || die "--wheelhouse needs a directory"; wheelhouse=$2; shift 2 ;;
        --wheelhouse=*) wheelhouse=${1#--wheelhouse=}; shift ;;
        --s3) s3=1; shift ;;
        --extras) [ $# -ge 2 ] || die "--extras needs a value: all, or a comma list (see docs/install.md)"; extras=$2; shift 2 ;;
        --extras=*) extras=${1#--extras=}; shift ;;
        --no-link) link=0; shift ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown option '$1' (see: ./install.sh --help)" ;;
    esac
done

src=${BASH_SOURCE[0]:-}
if [ -z "$src" ] || [ ! -f "$src" ]; then
    die "run install.sh from a cdui checkout (git clone ... && cd ... && ./install.sh), not from a pipe"
fi
root=$(cd "$(dirname "$(readlink -f -- "$src")")" && pwd -P)
launcher=$root/bin/cdui
[ -x "$launcher" ] || die "$launcher is missing or not executable"

if [ -n "${CODEFYUI_RELEASE_TAG:-}" ]; then
    have=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$root/cdui/__init__.py")
    [ "$have" = "${CODEFYUI_RELEASE_TAG#v}" ] ||
        die "this checkout is cdui $have, not CODEFYUI_RELEASE_TAG=$CODEFYUI_RELEASE_TAG; check out that release first (git checkout <tag>)"
fi

args=()
[ -z "$gpu" ] || args+=(--gpu "$gpu")
[ -z "$wheelhouse" ] || args+=(--wheelhouse "$wheelhouse")
[ "$s3" = 0 ] || args+=(--s3)
[ -z "$extras" ] || args+=(--extras "$extras")
"$launcher" install ${args[@]+"${args[@]}"}

if [ "$link" = 1 ]; then
    bindir=$HOME/.local/bin
    mkdir -p "$bindir"
    ln -sfn "$launcher" "$bindir/cdui"
    echo "install.sh: linked $bindir/cdui -> $launcher" >&2
    case ":$PATH:" in
        *":$bindir:"*) ;;
        *) echo "install.sh: warning: $bindir is not on your PATH; add it, e.g.: echo 'export PATH=\"\$HOME/.local/bin:\$PATH\"' >> ~/.profile" >&2 ;;
    esac
fi

version=$("$launcher" --version) || die "the installed cdui does not start ($launcher --version failed)"
echo "install.sh: $version installed in $root; start it with: cdui start" >&2
