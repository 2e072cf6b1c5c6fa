#!/bin/sh
# momentry-edge, one file: a launcher followed by a gzipped tar of the program folder.
# The first start unpacks it once into a cache folder named by its content; every
# start after that runs from there at once (a one-file build that unpacked itself at
# every start would read hundreds of megabytes each time).
set -eu
payload=@PAYLOAD_OFFSET@
build=@BUILD_ID@
case $0 in /*) self=$0 ;; *) self=$(pwd)/$0 ;; esac
cache=${MOMENTRY_EDGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/momentry-edge}
dir=$cache/$build
if [ ! -x "$dir/momentry-edge" ]; then
  mkdir -p "$cache"
  unpack=$(mktemp -d "$cache/.unpack.XXXXXX")
  tail -c +"$payload" "$self" | tar -xzf - -C "$unpack"
  # Another start may have finished first: keep its copy.
  mv "$unpack/momentry-edge" "$dir" 2>/dev/null || true
  rm -rf "$unpack"
fi
MOMENTRY_EDGE_EXECUTABLE=$self exec "$dir/momentry-edge" "$@"
