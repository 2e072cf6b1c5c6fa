#!/bin/sh
# momentry-edge, one file: a launcher followed by a gzipped tar of the program folder.
# The first start unpacks it once into a cache folder named by its content; every
# start after that runs from there at once (a one-file build that unpacked itself at
# every start would read hundreds of megabytes each time).
set -eu
payload=@PAYLOAD_OFFSET@
build=@BUILD_ID@
files=@FILE_COUNT@
case $0 in /*) self=$0 ;; *) self=$(pwd)/$0 ;; esac
cache=${MOMENTRY_EDGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/momentry-edge}
dir=$cache/$build

# Whole: the program is a file and every file the build packed is there (a cache
# cleaner may have emptied the folder; a race may have left something else in it).
whole() {
  [ -f "$1/momentry-edge/momentry-edge" ] && [ -x "$1/momentry-edge/momentry-edge" ] &&
    [ "$(find "$1" -type f | wc -l | tr -d ' ')" = "$files" ]
}

# An unpack is named by the pid of its launcher: one whose launcher is gone was
# killed half-way (its tar may still be writing, and fails once the folder is gone).
sweep() {
  for old in "$cache"/.unpack.* "$cache"/.stale.*; do
    [ -e "$old" ] || continue
    owner=${old##*/}
    owner=${owner#.*.}
    owner=${owner%%.*}
    case $owner in '' | *[!0-9]*) owner= ;; esac
    if [ -z "$owner" ] || ! kill -0 "$owner" 2>/dev/null; then
      rm -rf "$old"
    fi
  done
}

if ! whole "$dir"; then
  mkdir -p "$cache"
  sweep
  if [ -e "$dir" ]; then
    stale=$(mktemp -d "$cache/.stale.$$.XXXXXX")
    mv "$dir" "$stale/" 2>/dev/null || true
    rm -rf "$stale"
  fi
  unpack=$(mktemp -d "$cache/.unpack.$$.XXXXXX")
  tail -c +"$payload" "$self" | tar -xzf - -C "$unpack" &
  tar=$!
  trap 'kill "$tar" 2>/dev/null; rm -rf "$unpack"; exit 129' HUP
  trap 'kill "$tar" 2>/dev/null; rm -rf "$unpack"; exit 130' INT
  trap 'kill "$tar" 2>/dev/null; rm -rf "$unpack"; exit 143' TERM
  if ! wait "$tar" || ! whole "$unpack"; then
    rm -rf "$unpack"
    echo "momentry-edge: could not unpack into $cache (is the disk full?)" >&2
    exit 1
  fi
  trap - HUP INT TERM
  # Another start may have finished first: keep its copy.
  if ! whole "$dir"; then
    mv "$unpack" "$dir" 2>/dev/null || true
  fi
  rm -rf "$unpack"
  if ! whole "$dir"; then
    echo "momentry-edge: $dir is not what this build unpacks; remove it and start again" >&2
    exit 1
  fi
fi
MOMENTRY_EDGE_EXECUTABLE=$self exec "$dir/momentry-edge/momentry-edge" "$@"
