#!/usr/bin/env bash
# Builds the Kubernetes 1.20 control plane that tests/kube starts on 127.0.0.1, offline, from
# Debian bookworm alone, and prints the directory that holds it.
#
# The binaries live outside the repository, under
#   ${EDL_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edl-kube}/<hash of this script>/bin
# so editing this script builds afresh, and a second run only checks and prints that path.
# The directory holds kube-apiserver, kube-controller-manager, kube-scheduler (built from
# Debian's `kubernetes` source package, the vendored v1.20.2 tree), kubectl (unpacked from
# Debian's `kubernetes-client`, whose /usr/bin/kubectl may clash with another kubectl), and a
# link to etcd (Debian's `etcd-server`, 3.4).
#
# What must stay true:
# - stdout is the bin directory and nothing else; progress goes to stderr;
# - nothing is fetched from outside Debian's archive; apt runs only when a package is missing
#   (as root, or through sudo);
# - two runs at once build once (a lock per cache key), and a failed build leaves no half
#   bin directory behind.
#
# The one source change: github.com/modern-go/reflect2 v1.0.1, vendored by Kubernetes 1.20,
# reads runtime internals that Go 1.18 moved, and the binaries crash at start-up with Go 1.19;
# Debian's golang-github-modern-go-reflect2-dev (1.0.2) replaces it.
set -euo pipefail

readonly K8S_SOURCE=kubernetes
readonly K8S_UPSTREAM=1.20.2
readonly GO_BIN=/usr/lib/go-1.19/bin
readonly REFLECT2_SRC=/usr/share/gocode/src/github.com/modern-go/reflect2
readonly PACKAGES=(
  golang-1.19-go rsync make dpkg-dev xz-utils etcd-server openssl
  golang-github-modern-go-reflect2-dev
)
readonly BUILT=(kube-apiserver kube-controller-manager kube-scheduler)
readonly SRC_LIST=/etc/apt/sources.list.d/edl-bookworm-src.sources

log() { printf '[kube-testenv] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

as_root() {
  if [[ $(id -u) == 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null; then
    sudo "$@"
  else
    die "needs root (or sudo) to run: $*"
  fi
}

script_hash=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)
cache_root=${EDL_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edl-kube}
key_dir=$cache_root/$script_hash
bin_dir=$key_dir/bin

complete() {
  local name
  for name in "${BUILT[@]}" kubectl etcd; do
    [[ -x $bin_dir/$name ]] || return 1
  done
}

missing_packages() {
  local pkg
  for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' \
      || printf '%s\n' "$pkg"
  done
}

apt_updated=false
apt_update() {
  if [[ $apt_updated == false ]]; then
    log "apt-get update"
    as_root apt-get update -qq >&2
    apt_updated=true
  fi
}

ensure_packages() {
  local missing
  mapfile -t missing < <(missing_packages)
  if ((${#missing[@]})); then
    apt_update
    log "installing ${missing[*]}"
    # etcd-server's maintainer script may try to start a system etcd; the tests start their
    # own on free ports, so a refused service start is harmless.
    as_root env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  fi
}

ensure_source_index() {
  if apt-cache showsrc "$K8S_SOURCE" 2>/dev/null | grep -q "^Version: .*really$K8S_UPSTREAM"; then
    return
  fi
  log "adding deb-src entries for bookworm to $SRC_LIST"
  as_root tee "$SRC_LIST" >/dev/null <<'EOF'
# Added by EDL's scripts/kube-testenv.sh: the tests build Kubernetes 1.20 from source.
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  apt_updated=false
  apt_update
  apt-cache showsrc "$K8S_SOURCE" | grep -q "^Version: .*really$K8S_UPSTREAM" \
    || die "Debian's $K8S_SOURCE source package is not the $K8S_UPSTREAM tree"
}

build() {
  local work=$1 started=$SECONDS
  cd "$work"

  log "apt-get source $K8S_SOURCE"
  apt-get source -qq "$K8S_SOURCE" >&2
  local src
  src=$(find . -maxdepth 1 -type d -name "$K8S_SOURCE-*" | head -n1)
  [[ -n $src ]] || die "apt-get source unpacked no $K8S_SOURCE-* directory"

  # Kubernetes 1.20 builds in GOPATH mode (hack/lib/init.sh sets GO111MODULE=off) from
  # $GOPATH/src/k8s.io/kubernetes, with vendor/ as the only source of dependencies.
  local tree=$work/go/src/k8s.io/kubernetes
  mkdir -p "$(dirname "$tree")"
  mv "$src" "$tree"
  rm -rf "$tree/vendor/github.com/modern-go/reflect2"
  cp -r "$REFLECT2_SRC" "$tree/vendor/github.com/modern-go/reflect2"

  local what=()
  local name
  for name in "${BUILT[@]}"; do what+=("cmd/$name"); done
  log "make WHAT=\"${what[*]}\" (several minutes)"
  (
    cd "$tree"
    env -u GOFLAGS -u GOROOT HOME="$work/home" GOPATH="$work/go" GOCACHE="$work/gocache" \
      PATH="$GO_BIN:$PATH" CGO_ENABLED=0 GO111MODULE=off \
      make WHAT="${what[*]}" >&2
  )

  log "unpacking kubectl from kubernetes-client"
  mkdir -p "$work/client" "$work/bin"
  (cd "$work/client" && apt-get download -qq kubernetes-client >&2)
  dpkg-deb -x "$(find "$work/client" -name 'kubernetes-client_*.deb' | head -n1)" "$work/client/root"

  for name in "${BUILT[@]}"; do cp "$tree/_output/bin/$name" "$work/bin/"; done
  cp "$work/client/root/usr/bin/kubectl" "$work/bin/"
  log "built in $((SECONDS - started)) s"
}

main() {
  if ! complete; then
    mkdir -p "$key_dir"
    exec 9>"$key_dir/lock"
    flock 9
    ensure_packages
    if ! complete; then
      ensure_source_index
      local work
      work=$(mktemp -d "$key_dir/build.XXXXXX")
      # shellcheck disable=SC2064  # expand now: $work is local
      trap "chmod -R u+w '$work' 2>/dev/null; rm -rf '$work'" EXIT
      build "$work"
      ln -s "$(command -v etcd)" "$work/bin/etcd"
      rm -rf "$bin_dir"
      mv "$work/bin" "$bin_dir"
    fi
  fi
  "$bin_dir/kube-apiserver" --version >&2
  printf '%s\n' "$bin_dir"
}

main "$@"
