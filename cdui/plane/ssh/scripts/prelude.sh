# Every remote script starts with this part (after its header of parameters;
# see cdui/plane/ssh/ssh.py).

PATH="$HOME/.local/bin:$PATH"
export PATH
umask 077

# Whether PID $1 is alive and an `agent start`: a reused PID is some other process of the
# user's. Without /proc/<pid>/cmdline there is no telling, and a live PID is taken as the agent.
is_agent() {
    kill -0 "$1" 2>/dev/null &&
        { [ ! -r "/proc/$1/cmdline" ] || tr '\000' ' ' <"/proc/$1/cmdline" | grep -q "agent start"; }
}
