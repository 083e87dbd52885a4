# A part of the scripts that run the remote cdui (prepare, tunnel, cleanup).

# Sets cdui to the path of the remote cdui as the user typed it ($1): a leading ~/ means the
# remote home; anything else is used as it is. The value is data, never shell text.
set_launcher() {
    case $1 in
        \~/*) cdui="$HOME/${1#\~/}" ;;
        *) cdui=$1 ;;
    esac
}
