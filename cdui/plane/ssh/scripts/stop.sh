# A short ssh when no connection is there: stop the slot's agent (its runs get their grace).
# Parameters: MARK SLOT_DIR.

d="$HOME/$SLOT_DIR"
stop_agent
exit "$r"
