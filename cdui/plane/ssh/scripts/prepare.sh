# The short preparatory ssh: the state folder (0700, its parent too), no stale socket, the log's
# offset marked, the full path reported; the slot's old credential forgotten on its first use (FORGET=1); an agent of the
# legacy layout stopped when nothing is connected to it.
# Parameters: MARK STATE_ROOT SLOT_DIR URL CDUI FORGET SLOT SLOT_HEX.

r="$HOME/$STATE_ROOT"
d="$HOME/$SLOT_DIR"
mkdir -p "$r" && chmod 700 "$r" && mkdir -p "$d" && chmod 700 "$d" || exit 1
rm -f "$d/sock"
# Where the agent's log stands now that no socket is there: a running agent can connect again only
# through the next long-lived ssh's forward, so every "connected" line after this offset is through
# that one. The tunnel script follows the log from here when it attaches, so that a reconnection
# logged before its follower started is not missed.
touch "$d/agent.log" && echo $(($(wc -c <"$d/agent.log"))) >"$d/log.mark"

if [ -n "$FORGET" ]; then
    set_launcher "$CDUI"
    "$cdui" agent forget "$URL" >/dev/null 2>&1
    echo "$MARK forgot $URL"
fi

# An older version's agent: its PID in ~/.codefyui-ssh/<slot>/, connected over the remote
# loopback's TCP port <slot>. It is stopped only once no connection on that port is confirmed
# (ss, else /proc/net/tcp); with one, or with no way to tell, it is only reported. The PID must
# still be an `agent start`: a reused PID is some other process of the user's.
l="$r/$SLOT"
if [ -s "$l/agent.pid" ]; then
    p=$(cat "$l/agent.pid")
    if is_agent "$p"; then
        if command -v ss >/dev/null 2>&1; then
            if ss -Htn state established "( sport = :$SLOT or dport = :$SLOT )" | grep -q .; then
                c=1
            else
                c=0
            fi
        elif [ -r /proc/net/tcp ]; then
            # Established (state 01) with the port as either end; fields 2 and 3 are the local and
            # remote address, the port in 4 hex digits.
            if cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk -v port="$SLOT_HEX" '
                $4 == "01" && ($2 ~ (":" port "$") || $3 ~ (":" port "$")) { f = 1 }
                END { exit !f }'; then
                c=1
            else
                c=0
            fi
        else
            c=2
        fi
        if [ "$c" = 0 ]; then
            kill -TERM "$p" && echo "$MARK legacy agent $p in $l stopped"
        elif [ "$c" = 1 ]; then
            echo "$MARK legacy agent $p in $l has a connection; left running"
        else
            echo "$MARK legacy agent $p in $l left running: cannot tell whether a connection is attached" \
                "(neither ss nor /proc/net/tcp)"
        fi
    fi
fi

cd "$d" && echo "$MARK dir=$(pwd -P)"
