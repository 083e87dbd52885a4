# A part of the scripts that must not miss an agent being started (tunnel, stop, cleanup).

# Whether $d/agent.starting names a live process starting an agent; its PID is left in w.
starting() {
    w=$(cat "$d/agent.starting" 2>/dev/null) && [ -n "$w" ] && is_agent "$w"
}

# While such a start has written neither agent.pid nor agent.exit, wait for it: 30 s at most.
wait_starting() {
    i=0
    while [ ! -s "$d/agent.pid" ] && [ ! -s "$d/agent.exit" ] && [ "$i" -lt 300 ] && starting; do
        sleep 0.1
        i=$((i + 1))
    done
}
