#!/usr/bin/env bash
# TensorBoard for a sweep, reached from a laptop through an SSH tunnel; nothing listens beyond 127.0.0.1.
#
#   On the login node:  scripts/tensorboard-ssh.sh [--logdir DIR] [--port PORT]
#       starts TensorBoard on a free port of 127.0.0.1 and prints the ssh line to run on the laptop.
#   On the laptop:      scripts/tensorboard-ssh.sh USER@LOGIN-NODE [--logdir DIR] [--port PORT]
#       opens the tunnel and starts TensorBoard on the login node through it; Ctrl-C stops both.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: tensorboard-ssh.sh [USER@HOST] [--logdir DIR] [--port PORT] [--tensorboard CMD]

Without USER@HOST (run it on the login node): start TensorBoard bound to 127.0.0.1 on a free
port for DIR (default: the current directory) and print the `ssh -L` line to run on your laptop.

With USER@HOST (run it on your laptop): open `ssh -L PORT:127.0.0.1:PORT USER@HOST` and run
TensorBoard for DIR on HOST through it; then browse http://127.0.0.1:PORT. DIR is a path on HOST.

  --logdir DIR        the sweep dir (or any TensorBoard logdir); default: .
  --port PORT         the port on both ends; default: a free port here (laptop: 6006 upward)
  --tensorboard CMD   the TensorBoard executable on the login node; default: tensorboard
  -h, --help          this text
USAGE
}

host="" logdir="." port="" tensorboard="tensorboard"
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --logdir) logdir=${2:?--logdir needs a value}; shift 2 ;;
        --logdir=*) logdir=${1#*=}; shift ;;
        --port) port=${2:?--port needs a value}; shift 2 ;;
        --port=*) port=${1#*=}; shift ;;
        --tensorboard) tensorboard=${2:?--tensorboard needs a value}; shift 2 ;;
        --tensorboard=*) tensorboard=${1#*=}; shift ;;
        -*) echo "tensorboard-ssh.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
        *)
            if [[ -n "$host" ]]; then echo "tensorboard-ssh.sh: one host only (got $host and $1)" >&2; exit 2; fi
            host=$1; shift ;;
    esac
done
if [[ -n "$port" && ! "$port" =~ ^[0-9]+$ ]]; then
    echo "tensorboard-ssh.sh: --port must be a number, got $port" >&2; exit 2
fi

# A port nothing listens on here: the kernel picks one, we release it and use it.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

if [[ -z "$host" ]]; then
    [[ -d "$logdir" ]] || { echo "tensorboard-ssh.sh: no such directory: $logdir" >&2; exit 2; }
    logdir=$(cd "$logdir" && pwd)
    port=${port:-$(free_port)}
    login="${USER:-$(id -un)}@$(hostname -f 2>/dev/null || hostname)"
    printf 'TensorBoard for %s on 127.0.0.1:%s. On your laptop run:\n\n' "$logdir" "$port"
    printf '    ssh -N -L %s:127.0.0.1:%s %q\n\n' "$port" "$port" "$login"
    printf 'then open http://127.0.0.1:%s\n\n' "$port"
    exec "$tensorboard" --logdir "$logdir" --host 127.0.0.1 --port "$port"
fi

if [[ -z "$port" ]]; then
    # The same number on both ends keeps the URL simple; the remote side fails loudly if taken.
    port=6006
    until python3 -c 'import socket, sys; socket.socket().bind(("127.0.0.1", int(sys.argv[1])))' "$port" 2>/dev/null; do
        port=$((port + 1))
    done
fi
# ssh joins its remote arguments with spaces and hands them to the remote shell: quote each one.
remote=$(printf '%q ' "$tensorboard" --logdir "$logdir" --host 127.0.0.1 --port "$port")
printf 'Tunnel to %s; open http://127.0.0.1:%s (Ctrl-C stops TensorBoard and the tunnel)\n' "$host" "$port"
exec ssh -t -L "$port:127.0.0.1:$port" -- "$host" "$remote"
