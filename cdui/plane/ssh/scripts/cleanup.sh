# Delete and remove: stop the agent, forget the slot's credential, delete the slot's folder. Only
# this control plane's own <id>-<slot> folder; both kept if the agent cannot be stopped or a
# connection is still attached (its socket is still served).
# Parameters: MARK SLOT_DIR URL CDUI.

d="$HOME/$SLOT_DIR"
stop_agent
if [ "$r" -ne 0 ]; then
    echo "$MARK kept $d and the credential for $URL"
    exit 3
fi
if [ -S "$d/sock" ] &&
    { if command -v ss >/dev/null 2>&1; then ss -Hxl; else cat /proc/net/unix 2>/dev/null; fi; } |
    grep -qF "$d/sock"; then
    echo "$MARK a connection is still attached to $d/sock; kept $d and the credential for $URL"
    exit 3
fi
set_launcher "$CDUI"
"$cdui" agent forget "$URL" >/dev/null 2>&1
rm -rf "$d" && echo "$MARK cleaned $d and the credential for $URL"
