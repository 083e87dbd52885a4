# `cdui plugin push ID --to WORKER` for an SSH worker: install the pack that follows the script on
# stdin (SIZE bytes of .tar.gz) with the remote cdui, which refuses it unless that side accepts
# pushed packs (CODEFYUI_AGENT_ACCEPT_PLUGINS=1) and checks its files against the control plane's
# sha256; then ask the slot's agent, if one runs, to read its node catalog again (SIGUSR1).
# Parameters: MARK SLOT_DIR CDUI ID VERSION PIN TREE SIZE.

d="$HOME/$SLOT_DIR"
set_launcher "$CDUI"
if ! command -v "$cdui" >/dev/null 2>&1; then
    printf '%s\n' "$MARK $CDUI: not found"
    exit 127
fi
"$cdui" plugin receive "$ID" --version "$VERSION" --pin "$PIN" --tree "$TREE" --bytes "$SIZE" 2>&1
r=$?
if [ "$r" -ne 0 ]; then
    exit "$r"
fi
p=$(cat "$d/agent.pid" 2>/dev/null)
if [ -n "$p" ] && is_agent "$p"; then
    kill -USR1 "$p"
    echo "$MARK catalog reload pid=$p"
else
    echo "$MARK no agent running"
fi
