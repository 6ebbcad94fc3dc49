#!/usr/bin/env bash
# Builds gdrshim_<version>_amd64.deb from a release folder (scripts/dev/build-release.sh's).
#
#   scripts/dev/build-deb.sh [--dist DIR] [--out DIR]
#     --dist DIR    the release folder (default: build one with build-release.sh, in a temp folder)
#     --out DIR     where the .deb goes (default: target/deb/ of the source tree)
#     -h, --help    this text;  --version  the version being packaged
#
# The package holds the release folder exactly as scripts/deploy.sh installs it:
# /opt/rtx4090-gdr/releases/<version>-<first 12 hex digits of sha256(SHA256SUMS)>/, plus
# /usr/share/doc/gdrshim/copyright. Configuring it points /opt/rtx4090-gdr/current at that release
# by one rename (the release current named before becomes previous, as with deploy.sh); on an
# upgrade current follows to the new release once it is unpacked, before the old one's files go;
# removing it puts current back to previous, or removes it, before its files go. Configuring it
# adds NCCL_NET_FORCE_FLUSH=1 to /etc/nccl.conf where the release's gdrshim-tool gpu-facts names
# a GPU of sm_90 or later below OWNER, and removing the last release removes that line alone
# (scripts/nccl-conf.sh, as deploy.sh does). The maintainer scripts honour DPKG_ROOT
# (dpkg --root DIR --force-script-chrootless installs into a scratch root).
# Reproducible: SOURCE_DATE_EPOCH from Cargo.toml for every time, root:root owners
# (--root-owner-group), fixed modes, names sorted, xz on one thread; one release gives one .deb,
# byte for byte (scripts/dev/check-release.sh builds it twice and compares).
# Exit status: 0 built; 1 the release folder fails its SHA256SUMS or the build failed; 2 usage.
set -euo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
usage() { sed -n '2,22s/^# \{0,1\}//p' "$0"; }
bad_usage() { echo "build-deb: $1 (try --help)" >&2; exit 2; }
die() { echo "build-deb: $*" >&2; exit 1; }
cargo_version() { sed -n 's/^version = "\(.*\)"/\1/p' "$src/Cargo.toml" | head -n1; }
dist="" out="$src/target/deb"
while [ $# -gt 0 ]; do
  case "$1" in
    --dist|--out)
      if [ $# -lt 2 ] || [ -z "$2" ]; then bad_usage "$1 needs a folder"; fi
      if [ "$1" = --dist ]; then dist="$2"; else out="$2"; fi
      shift ;;
    -h|--help) usage; exit 0 ;;
    --version) echo "build-deb.sh (gdrshim) $(cargo_version)"; exit 0 ;;
    *) bad_usage "unknown argument $1" ;;
  esac
  shift
done
command -v dpkg-deb >/dev/null || die "dpkg-deb is not installed (apt-get install dpkg)"
epoch="$(sed -n 's/^source-date-epoch = \([0-9]*\)$/\1/p' "$src/Cargo.toml")"
[ -n "$epoch" ] || die "no source-date-epoch in Cargo.toml"
export SOURCE_DATE_EPOCH="$epoch"

work="$(mktemp -d)"
trap 'rm -rf -- "$work"' EXIT
if [ -z "$dist" ]; then
  bash "$src/scripts/dev/build-release.sh" --out "$work/dist" >/dev/null
  dist="$work/dist"
fi
if [ ! -d "$dist" ] || [ ! -f "$dist/SHA256SUMS" ]; then die "$dist is not a release folder (no SHA256SUMS)"; fi
dist="$(cd "$dist" && pwd)"
# what deploy.sh checks before it installs: every file as listed, and no file it does not list
(cd "$dist" && sha256sum -c --strict --quiet SHA256SUMS) || die "$dist does not match its SHA256SUMS"
listed="$(sed -E 's/^[0-9a-f]{64}  //' "$dist/SHA256SUMS" | LC_ALL=C sort)"
present="$(cd "$dist" && find . -mindepth 1 ! -type d ! -path ./SHA256SUMS -printf '%P\n' | LC_ALL=C sort)"
[ "$listed" = "$present" ] || die "$dist holds files its SHA256SUMS does not list"
version="$(head -n1 "$dist/BUILD-INFO" | awk '$1 == "gdrshim" {print $2}')"
[[ "$version" =~ ^[0-9][0-9A-Za-z.+-]*$ ]] || die "cannot read the version from $dist/BUILD-INFO"
name="$version-$(sha256sum "$dist/SHA256SUMS" | cut -c1-12)"
debver="${version//-/\~}" # a Cargo pre-release (1.0.0-rc.1) sorts before its release in dpkg as 1.0.0~rc.1
prefix=opt/rtx4090-gdr

pkg="$work/pkg"
mkdir -p "$pkg/DEBIAN" "$pkg/$prefix/releases/$name" "$pkg/usr/share/doc/gdrshim"
cp -R -- "$dist/." "$pkg/$prefix/releases/$name/"
{
  echo "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
  echo "Upstream-Name: gdrshim"
  echo
  echo "Files: *"
  echo "Copyright: the gdrshim developers"
  echo "License: MIT or Apache-2.0"
  echo " The full texts: /$prefix/releases/$name/LICENSE-MIT and LICENSE-APACHE,"
  echo " and /usr/share/common-licenses/Apache-2.0."
} >"$pkg/usr/share/doc/gdrshim/copyright"

# The maintainer scripts (POSIX sh). @REL@ is this package's release, relative to the prefix.
# Each writes the Container Device Interface spec of the release current names (its own
# gdrshim-tool cdi) to /etc/cdi/gdrshim.json, or removes one that mounts a release of this prefix
# where current is gone or its tool has no cdi (a generated file: dpkg does not own it).
# shellcheck disable=SC2016 # shell text written into the maintainer scripts as it is
cdi_sh='cdi_spec() {
  spec="${DPKG_ROOT:-}/etc/cdi/gdrshim.json"
  if [ -d "$prefix/current" ] && mkdir -p "${spec%/*}" && "$prefix/current/bin/gdrshim-tool" cdi --release "$(cd "$prefix/current" && pwd -P)" --out "$spec" >/dev/null 2>&1; then
    echo "gdrshim: $spec written for containers (--device gdrshim/rdma=all)"
  elif [ -f "$spec" ] && grep -qF "\"hostPath\": \"$prefix/releases/" "$spec"; then
    rm -f "$spec"
    echo "gdrshim: $spec removed"
  fi
}'
# NCCL's line in /etc/nccl.conf: deploy.sh's functions, those each script calls
nccl_fns() {
  local f
  for f in "$@"; do
    awk -v f="$f" 'index($0, f "() {") == 1 { on = !/; }$/; print; next } on { print } /^}$/ { on = 0 }' "$src/scripts/nccl-conf.sh"
  done
}
cat >"$pkg/DEBIAN/postinst" <<'EOF'
#!/bin/sh
# gdrshim: point current at this package's release, by one rename; the release current named
# before becomes previous (for scripts/deploy.sh --rollback, and for removing this package).
set -e
prefix="${DPKG_ROOT:-}/opt/rtx4090-gdr"
rel="@REL@"
switch_link() { ln -sfn "$2" "$prefix/.$1.new" && mv -T "$prefix/.$1.new" "$prefix/$1"; }
@CDI@
@NCCL@
case "$1" in
  configure|abort-upgrade|abort-remove|abort-deconfigure)
    cur="$(readlink "$prefix/current" 2>/dev/null || true)"
    if [ "$cur" != "$rel" ]; then
      switch_link current "$rel"
      if [ -n "$cur" ] && [ -d "$prefix/$cur" ]; then switch_link previous "$cur"; fi
    fi
    echo "gdrshim: $prefix/current -> $rel"
    cdi_spec
    nccl_conf_add "$prefix/$rel/bin/gdrshim-tool" "@VERSION@"
    ;;
esac
exit 0
EOF
cat >"$pkg/DEBIAN/prerm" <<'EOF'
#!/bin/sh
# gdrshim: before this package's release goes, current goes back to previous (where that is
# another release that is still there) or is removed; a previous naming this release is removed.
# On an upgrade the new package's postinst switches current instead.
set -e
prefix="${DPKG_ROOT:-}/opt/rtx4090-gdr"
rel="@REL@"
switch_link() { ln -sfn "$2" "$prefix/.$1.new" && mv -T "$prefix/.$1.new" "$prefix/$1"; }
@CDI@
case "$1" in
  remove|deconfigure)
    cur="$(readlink "$prefix/current" 2>/dev/null || true)"
    prev="$(readlink "$prefix/previous" 2>/dev/null || true)"
    if [ "$cur" = "$rel" ]; then
      if [ -n "$prev" ] && [ "$prev" != "$rel" ] && [ -d "$prefix/$prev" ]; then
        switch_link current "$prev"
        rm -f "$prefix/previous"
        echo "gdrshim: $prefix/current -> $prev (was previous)"
      else
        rm -f "$prefix/current"
        echo "gdrshim: $prefix/current removed (no previous release)"
      fi
    elif [ "$prev" = "$rel" ]; then
      rm -f "$prefix/previous"
    fi
    cdi_spec
    ;;
esac
exit 0
EOF
cat >"$pkg/DEBIAN/postrm" <<'EOF'
#!/bin/sh
# gdrshim: on an upgrade the new version's files are unpacked and this release's are about to
# go: current, where it names this release, follows to the new one now (the one release folder
# of the new version), not only when the new one is configured. A current or previous link
# still naming this release once it is gone is removed; links to other releases stay. With no
# release current any more, gdrshim's NCCL_NET_FORCE_FLUSH=1 line goes from /etc/nccl.conf.
set -e
prefix="${DPKG_ROOT:-}/opt/rtx4090-gdr"
rel="@REL@"
switch_link() { ln -sfn "$2" "$prefix/.$1.new" && mv -T "$prefix/.$1.new" "$prefix/$1"; }
@NCCL@
if [ "$1" = upgrade ] && [ "$(readlink "$prefix/current" 2>/dev/null || true)" = "$rel" ]; then
  new_version="$(printf '%s' "${2:-}" | tr '~' '-')"
  set -- "$1" "$prefix/releases/$new_version"-*/
  if [ $# = 2 ] && [ -f "$2/SHA256SUMS" ]; then
    switch_link current "releases/$(basename "$2")"
  fi
  set -- upgrade
fi
case "$1" in
  remove|purge|abort-install|abort-upgrade|disappear|upgrade)
    for l in current previous; do
      if [ "$(readlink "$prefix/$l" 2>/dev/null || true)" = "$rel" ] && [ ! -d "$prefix/$rel" ]; then
        rm -f "$prefix/$l"
      fi
    done
    if [ "$1" != upgrade ] && [ ! -e "$prefix/current" ]; then nccl_conf_remove; fi
    ;;
esac
exit 0
EOF
sed -i "s|@REL@|releases/$name|" "$pkg/DEBIAN/postinst" "$pkg/DEBIAN/prerm" "$pkg/DEBIAN/postrm"
sed -i "s|@VERSION@|$version|" "$pkg/DEBIAN/postinst"
for f in postinst prerm postrm; do
  case "$f" in
    postinst) nccl_sh="$(nccl_fns nccl_conf_file nccl_conf_ours nccl_conf_add)" ;;
    *) nccl_sh="$(nccl_fns nccl_conf_file nccl_conf_ours nccl_conf_remove)" ;;
  esac
  CDI="$cdi_sh" NCCL="$nccl_sh" awk '$0 == "@CDI@" { print ENVIRON["CDI"]; next } $0 == "@NCCL@" { print ENVIRON["NCCL"]; next } { print }' "$pkg/DEBIAN/$f" >"$pkg/DEBIAN/$f.new"
  mv "$pkg/DEBIAN/$f.new" "$pkg/DEBIAN/$f"
done

# fixed modes whatever the umask: folders 0755, files 0755 where the release has them executable, else 0644
find "$pkg" -type d -exec chmod 0755 {} +
find "$pkg" -type f -perm /0111 -exec chmod 0755 {} +
find "$pkg" -type f ! -perm /0111 -exec chmod 0644 {} +
chmod 0755 "$pkg/DEBIAN/postinst" "$pkg/DEBIAN/prerm" "$pkg/DEBIAN/postrm"
(cd "$pkg" && find opt usr -type f | LC_ALL=C sort | xargs -d '\n' md5sum) >"$pkg/DEBIAN/md5sums"
# Installed-Size as dpkg-gencontrol counts it: KiB of each file rounded up, 1 per other entry
size="$(cd "$pkg" && find opt usr \( -type f -printf 'f %s\n' \) -o -printf 'o 0\n' |
  awk '{ n += ($1 == "f") ? int(($2 + 1023) / 1024) : 1 } END { print n }')"
cat >"$pkg/DEBIAN/control" <<EOF
Package: gdrshim
Version: $debver
Architecture: amd64
Maintainer: the gdrshim developers
Installed-Size: $size
Depends: libc6 (>= 2.35)
Section: utils
Priority: optional
Description: LD_PRELOAD shim: GPUDirect RDMA on GeForce GPUs
 libgdrshim.so makes GPUDirect RDMA registration work on GeForce GPUs (RTX 4090
 with the open kernel module, ConnectX-6/7 RoCE) by DMA-BUF or nvidia-peermem,
 with its tools (gdrshim-tool, gdrshim-replay) and scripts (gdr-env.sh, doctor,
 verify-run, deploy.sh). Installs /opt/rtx4090-gdr/releases/$name and
 points /opt/rtx4090-gdr/current at it.
EOF
chmod 0644 "$pkg/DEBIAN/control" "$pkg/DEBIAN/md5sums"
find "$pkg" -exec touch -h -d "@$epoch" {} +

threads=()
# xz on one thread: the same bytes on every machine (dpkg 1.21.9 and later have the option)
if dpkg-deb --help | grep -q -- '--threads-max'; then threads=(--threads-max=1); fi
mkdir -p "$out"
deb="$out/gdrshim_${debver}_amd64.deb"
dpkg-deb "${threads[@]}" --root-owner-group -Zxz -z6 --build "$pkg" "$work/out.deb" >/dev/null
mv -f -- "$work/out.deb" "$deb"
echo "build-deb: $deb ($name, sha256 $(sha256sum "$deb" | cut -c1-16)…)"
