# A part of the scripts that stop the slot's agent (stop, cleanup); needs starting.sh.

# SIGTERM to the slot's agent and wait (60 s at most) for it to exit; sets r=0 when none is left,
# else r=3. An agent the tunnel script has launched but that has not written agent.pid yet would be
# missed and start afterwards with nobody stopping it: wait_starting waits for it first, and one
# still starting after that is reported.
stop_agent() {
    r=0
    wait_starting
    p=$(cat "$d/agent.pid" 2>/dev/null)
    if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then
        kill -TERM "$p"
        i=0
        while kill -0 "$p" 2>/dev/null && [ "$i" -lt 600 ]; do
            sleep 0.1
            i=$((i + 1))
        done
        if kill -0 "$p" 2>/dev/null; then
            echo "$MARK agent $p still running"
            r=3
        else
            echo "$MARK agent $p stopped"
        fi
    elif [ ! -s "$d/agent.exit" ] && starting; then
        echo "$MARK agent starting (pid $w) did not report its PID within 30 s; left running"
        r=3
    else
        echo "$MARK no agent running"
    fi
}
