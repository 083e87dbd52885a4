# The long-lived ssh's remote side: reattach to a running agent, or start one detached (its own
# session, output to agent.log, exit code to agent.exit), then follow its log until the agent
# exits or stdin ends.
# Parameters: MARK SLOT_DIR URL CDUI NAME.
#
# stdin: its first line is the one-time enrollment token (never an argument); later lines are
# commands ("stop": SIGTERM to the agent); its end means the control plane let go of the
# connection: this script exits and the agent keeps running (it reattaches on the next start).
#
# Between the start and the agent writing agent.pid (its imports, maybe its enrollment) the
# starting wrapper's PID is in agent.starting, so that a stop arriving meanwhile over a short ssh
# waits for the agent instead of finding none (stop_agent), and so does the next attempt's script
# when this ssh dropped in that window: it attaches to that agent.

d="$HOME/$SLOT_DIR"
exec 3<&0
IFS= read -r t <&3 || t=

# An agent an earlier attempt launched just before its ssh dropped may not have written
# agent.pid yet: wait for it and attach, rather than start a second agent on the slot.
wait_starting
p=$(cat "$d/agent.pid" 2>/dev/null)
if [ -n "$p" ] && is_agent "$p"; then
    echo "$MARK attached pid=$p"
    a=1
else
    a=
    set_launcher "$CDUI"
    # The path as the user typed it is printed, not run: printf, not echo, so that backslashes
    # in it stay as they are too.
    if ! command -v "$cdui" >/dev/null 2>&1; then
        printf '%s\n' "$MARK $CDUI: not found"
        exit 127
    fi
    if [ -f "$cdui" ] && [ ! -x "$cdui" ]; then
        printf '%s\n' "$MARK $CDUI: not executable"
        exit 126
    fi
    rm -f "$d/agent.pid" "$d/agent.exit" "$d/agent.starting"
    touch "$d/agent.log"
    off=$(wc -c <"$d/agent.log")
    CODEFYUI_AGENT_TOKEN=$t
    # The control plane keeps this agent: it follows `cdui update` through this tunnel (docs/updating.md).
    CODEFYUI_AGENT_AUTO_UPDATE=1
    export CODEFYUI_AGENT_TOKEN CODEFYUI_AGENT_AUTO_UPDATE
    if command -v setsid >/dev/null 2>&1; then s=setsid; else s=; fi
    # $s is setsid or nothing. The background PID ($!) is this command's own (setsid execs the
    # sh), whose command line says `agent start`: what is_agent looks for in agent.starting.
    # The inner sh's $0 is the folder and "$@" the agent's command line.
    # shellcheck disable=SC2016,SC2086
    $s sh -c '"$@" </dev/null >>"$0/agent.log" 2>&1; echo $? >"$0/agent.exit"' "$d" "$cdui" \
        agent start --uds "$d/sock" --foreground --control "$URL" --name "$NAME" &
    echo $! >"$d/agent.starting"
    unset CODEFYUI_AGENT_TOKEN CODEFYUI_AGENT_AUTO_UPDATE t
    i=0
    while [ ! -s "$d/agent.pid" ] && [ ! -s "$d/agent.exit" ] && [ "$i" -lt 600 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    rm -f "$d/agent.starting"
    p=$(cat "$d/agent.pid" 2>/dev/null)
    if [ -z "$p" ]; then
        tail -c +$((off + 1)) "$d/agent.log"
        e=$(cat "$d/agent.exit" 2>/dev/null)
        echo "$MARK agent exited code=${e:-?}"
        exit "${e:-1}"
    fi
    echo "$MARK started pid=$p"
fi

if [ -n "$a" ]; then
    # From the preparation's mark: the agent may have reconnected through this ssh's forward (and
    # logged it) before this follower starts.
    m=$(cat "$d/log.mark" 2>/dev/null)
    case $m in
        '' | *[!0-9]*) tail -n 0 -f --pid="$p" "$d/agent.log" & ;;
        *) tail -c +$((m + 1)) -f --pid="$p" "$d/agent.log" & ;;
    esac
else
    tail -c +$((off + 1)) -f --pid="$p" "$d/agent.log" &
fi
f=$!
# stdin: "stop" asks the agent to stop; its end (ssh gone) ends the follower, not the agent.
# (fd 3: a background list's stdin would otherwise be /dev/null.)
(
    while IFS= read -r c; do
        [ "$c" = stop ] && kill -TERM "$p" 2>/dev/null
    done
    kill "$f" 2>/dev/null
) <&3 >/dev/null 2>&1 &
wait "$f"
if kill -0 "$p" 2>/dev/null; then
    exit 0
fi
i=0
while [ ! -s "$d/agent.exit" ] && [ "$i" -lt 50 ]; do
    sleep 0.1
    i=$((i + 1))
done
e=$(cat "$d/agent.exit" 2>/dev/null)
echo "$MARK agent exited code=${e:-?}"
exit "${e:-1}"
