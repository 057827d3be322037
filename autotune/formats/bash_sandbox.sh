# Bash reads a launch script here, with nothing able to act on the machine (autotune/formats/bash_eval.py).
#
#   bash --noprofile --norc bash_sandbox.sh RECORD_FILE WORK_DIR SCRIPT
#
# Before every simple command bash runs the DEBUG trap below; with extdebug a trap that fails skips the
# command, and functrace keeps the trap in functions, subshells and command substitutions. The trap lets
# bash run only what changes the shell itself: assignments, the script's own functions, builtins that read
# or compute (cd, source, eval, printf...), and a few pure programs (dirname, basename...). Everything else
# is skipped, before bash opens its redirections, and recorded with its arguments as bash expanded them:
# the trainer's entry points are among them. A skipped command prints a marker, so a value taken from its
# output says where it came from. PATH names an empty folder: a command the trap let through by mistake is
# not found on disk either. The caller adds a time limit, and stdin is empty.

__autotune_record_file=$1
__autotune_work=$2
__autotune_script=$3
exec {__autotune_fd}>>"$__autotune_record_file"
__autotune_count=0
__autotune_self=${BASH_SOURCE[0]}

# builtins that change only the shell; exec, command and builtin are wrappers, classified by what they run
__autotune_builtins=" : true false echo printf export declare typeset local readonly unset shift set shopt \
source . eval let test [ cd pushd popd dirs pwd read mapfile readarray return exit break continue getopts \
type caller wait alias unalias "
__autotune_pure=" dirname basename realpath readlink seq expr "
# one redirection at the end of a command as bash prints it (words first, then redirections)
__autotune_redirect=' ([0-9]+|\{[A-Za-z_][A-Za-z0-9_]*\})?(&>>|&>|>>|>\||>&|<<<|<>|<&|>|<) ?("[^"]*"|'"'[^']*'"'|[^ "'"'"'()]+)$'
__autotune_heredoc=' <<-? ?['"'"'"]?[A-Za-z_][A-Za-z0-9_]*['"'"'"]?'$'\n'

__autotune_emit() {  # KIND COMMAND ARG...: one record, NUL-separated, with where the command is written
    local kind=$1 command=$2
    shift 2
    printf '%s\0' "$kind" "$__autotune_file" "$__autotune_line" "$command" "$#" "$@" >&"$__autotune_fd"
}

__autotune_safe_redirects() {  # REDIRECTIONS: true when they write no file and open no socket
    local text=$1 target re='(&>>|&>|>>|>\||>&|<>|>)[[:space:]]*([^[:space:]]*)'
    [[ $text == *"/dev/tcp"* || $text == *"/dev/udp"* ]] && return 1
    while [[ $text =~ $re ]]; do
        target=${BASH_REMATCH[2]}
        text=${text#*"${BASH_REMATCH[0]}"}
        [[ $target == /dev/null || (${BASH_REMATCH[1]} == ">&" && $target =~ ^([0-9]+-?|-)$) ]] || return 1
    done
}

# The two functions below evaluate __autotune_text, a command's words, where the command stands: called
# with the script's positional parameters, so that "$@" and $1 are the script's (or its function's).
__autotune_split() {  # COMMAND: __autotune_text, its words; __autotune_redirects, what follows them
    __autotune_text=$1 __autotune_redirects=''
    if [[ $__autotune_text =~ $__autotune_heredoc ]]; then # the body follows the first line: data
        __autotune_text=${__autotune_text%%"${BASH_REMATCH[0]}"*}
        __autotune_redirects=${1:${#__autotune_text}}
    fi
    while [[ $__autotune_text =~ $__autotune_redirect ]]; do
        __autotune_text=${__autotune_text%"${BASH_REMATCH[0]}"}
        __autotune_redirects=${BASH_REMATCH[0]}$__autotune_redirects
    done
}

__autotune_expand() {  # sets __autotune_argv to the words as bash expands them; false when bash cannot
    local __autotune_out="$__autotune_work/words.$BASHPID"
    : >"$__autotune_out"
    (
        trap '__autotune_trap "$@"' DEBUG
        __autotune_words=(@autotune-unexpanded@) # stays when bash refuses the words (a syntax error)
        eval "__autotune_words=( $__autotune_text )"
        printf '%s\0' "${__autotune_words[@]}" >"$__autotune_out"
    ) 2>>"$__autotune_work/expand.err"
    mapfile -d '' -t __autotune_argv <"$__autotune_out"
    [[ ${__autotune_argv[0]:-} != @autotune-unexpanded@ ]]
}

__autotune_call() {  # a function (or source, eval) called without its redirections, in a subshell
    (
        trap '__autotune_trap "$@"' DEBUG
        eval "$__autotune_text"
    ) >/dev/null
}

__autotune_skip() {  # KIND COMMAND ARG...: record the command, and stand in for its output
    local marker
    __autotune_count=$((__autotune_count + 1))
    marker="@autotune-skipped-$BASHPID-$__autotune_count@"
    __autotune_emit "$@"
    __autotune_emit marker "$2" "$marker"
    printf '%s' "$marker"
    return 1
}

__autotune_let() {  # COMMAND REDIRECTIONS [NAME ARGS...]: bash runs the command when its redirections
    # are harmless; a function, source or eval (NAME) whose redirections write runs without them
    __autotune_safe_redirects "$2" && return 0
    if [[ -n ${3:-} && ($(type -t -- "$3") == function || " source . eval " == *" $3 "*) ]]; then
        shift 3
        __autotune_call "$@"
        return 1
    fi
    __autotune_emit redirect "$1"
    return 1
}

__autotune_trap() {  # "$@": the positional parameters where the command stands
    local __autotune_own_text __autotune_errexit=0 __autotune_status
    [[ $BASH_COMMAND == __autotune_* ]] && return 0 # the sandbox's own statements
    for __autotune_own_text in "${__autotune_own[@]}"; do [[ $BASH_COMMAND == "$__autotune_own_text" ]] && return 0; done
    # A skipped command stands for one that succeeds. The trap's failing return would trip the script's
    # `set -e` (errexit), so errexit is off while the trap decides, and after a skip until the next command.
    [[ $- == *e* || ${__autotune_errexit_pending:-} == "$BASHPID" ]] && __autotune_errexit=1
    __autotune_errexit_pending=''
    set +ex # and no trace of the sandbox
    __autotune_decide "$@"
    __autotune_status=$?
    if ((__autotune_errexit)); then
        if ((__autotune_status == 0)); then set -e; else __autotune_errexit_pending=$BASHPID; fi
    fi
    return $__autotune_status
}

__autotune_decide() {  # "$@": as the trap's; true to let bash run the command, false to skip it
    # locals are named __autotune_*: the script's own variables must show through to what it expands
    local __autotune_command=$BASH_COMMAND __autotune_redirects='' __autotune_name __autotune_kind
    set -T
    shopt -s extdebug
    if [[ ${BASH_SOURCE[2]:-} != "$__autotune_self" ]]; then # inside the sandbox: the command it expands
        __autotune_file=${BASH_SOURCE[2]:-} __autotune_line=${BASH_LINENO[1]:-0}
    fi
    case $__autotune_command in
    '(('* | '[['* | 'for '* | 'for(('* | 'case '* | 'select '*) return 0 ;; # bash evaluates these itself
    esac
    __autotune_split "$__autotune_command"
    if [[ $__autotune_text =~ ^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=\( ]]; then # an array assignment
        __autotune_let "$__autotune_command" "$__autotune_redirects"
        return
    fi
    __autotune_name=${__autotune_text%% *}
    if [[ $__autotune_name == "[" || $__autotune_name =~ ^[A-Za-z_.:][A-Za-z0-9_.:-]*$ ]]; then # nothing to expand
        __autotune_kind=$(type -t -- "$__autotune_name" 2>/dev/null)
        if [[ " exec command builtin " != *" $__autotune_name "* ]] && [[ $__autotune_kind == function ||
            ($__autotune_kind == builtin && $__autotune_builtins == *" $__autotune_name "*) ]]; then
            __autotune_let "$__autotune_command" "$__autotune_redirects" "$__autotune_name" "$@"
            return
        fi
    fi
    if ! __autotune_expand "$@"; then
        __autotune_emit unreadable "$__autotune_command"
        return 1
    fi
    __autotune_classify "$__autotune_command" "$__autotune_redirects" "${__autotune_argv[@]}"
}

__autotune_classify() {  # COMMAND REDIRECTIONS ARGV...: let it run, or skip and record it
    local command=$1 redirects=$2 kind wrapper
    shift 2
    while (($#)) && [[ $1 =~ ^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?= ]]; do shift; done # NAME=value prefixes
    if ((!$#)); then
        __autotune_let "$command" "$redirects"
        return
    fi
    case $1 in
    exec | command | builtin)
        wrapper=$1
        shift
        [[ $wrapper == exec ]] || while [[ ${1:-} == -* && $1 != -[vV] ]]; do shift; done
        if ((!$#)) && [[ $wrapper == exec && -n $redirects ]]; then
            __autotune_emit redirect "$command" # a bare exec redirects the whole shell
            return 1
        fi
        if ((!$#)) || [[ $wrapper == command && $1 == -[vV] ]]; then
            __autotune_let "$command" "$redirects"
            return
        fi
        __autotune_classify "$command" "$redirects" "$@"
        return
        ;;
    esac
    kind=$(type -t -- "$1" 2>/dev/null)
    if [[ $1 != */* && ($kind == function || ($kind == builtin && $__autotune_builtins == *" $1 "*)) ]]; then
        __autotune_let "$command" "$redirects"
        return
    fi
    if [[ $1 != */* && $__autotune_pure == *" $1 "* ]]; then
        __autotune_let "$command" "$redirects" # command_not_found_handle runs it from its real path
        return
    fi
    __autotune_skip "$([[ $kind == builtin ]] && echo builtin || echo command)" "$command" "$@"
}

command_not_found_handle() {  # reached only by the pure programs the trap lets through
    local __autotune_path="__AUTOTUNE_PURE_$1"
    [[ $__autotune_pure == *" $1 "* && -n ${!__autotune_path:-} ]] || return 127
    shift
    "${!__autotune_path}" "$@"
}

# the sandbox's own statements, as bash prints them to the trap: let through as they are
__autotune_own=(
    "trap '__autotune_trap \"\$@\"' DEBUG"
    'eval "__autotune_words=( $__autotune_text )"'
    "printf '%s\\0' \"\${__autotune_words[@]}\" > \"\$__autotune_out\""
    'eval "$__autotune_text"'
    'local __autotune_path="__AUTOTUNE_PURE_$1"'
    '[[ $__autotune_pure == *" $1 "* && -n ${!__autotune_path:-} ]]'
    'shift'
    '"${!__autotune_path}" "$@"'
)

__autotune_script_path=$__autotune_script
set --
BASH_ARGV0=$__autotune_script_path
unset __autotune_script
trap '__autotune_trap "$@"' DEBUG
set -T
shopt -s extdebug
source "$__autotune_script_path"
