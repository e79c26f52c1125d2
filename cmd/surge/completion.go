package main

import (
	"fmt"
	"strings"
)

// commands are surge's top-level commands, for help and completion.
var commands = []string{"embedded", "run", "loadgen", "wallet", "uin", "push", "recon", "topics", "produce", "consume", "schemas", "replay", "rebuild", "clickhouse", "probe", "config", "version", "completion"}

// completionBash is a bash (and zsh with bashcompinit) completion script:
// commands, then each command's flags as its own --help lists them, so
// it always matches the binary it completes.
const completionBash = `# surge completion; load with: source <(surge completion bash)
_surge() {
  local cur=${COMP_WORDS[COMP_CWORD]}
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=($(compgen -W "%s" -- "$cur"))
    return
  fi
  local cmd=${COMP_WORDS[1]}
  case "$cmd" in
    run)    [ "$COMP_CWORD" -eq 2 ] && COMPREPLY=($(compgen -W "%s" -- "$cur")) && return ;;
    uin)    [ "$COMP_CWORD" -eq 2 ] && COMPREPLY=($(compgen -W "run classify restore gaps demo" -- "$cur")) && return ;;
    push)   [ "$COMP_CWORD" -eq 2 ] && COMPREPLY=($(compgen -W "pause resume cancel" -- "$cur")) && return ;;
    recon)  [ "$COMP_CWORD" -eq 2 ] && COMPREPLY=($(compgen -W "report run serve" -- "$cur")) && return ;;
    wallet) [ "$COMP_CWORD" -eq 2 ] && COMPREPLY=($(compgen -W "keygen token sign" -- "$cur")) && return ;;
  esac
  if [[ "$cur" == -* ]]; then
    local sub=""
    [ "$cmd" = wallet ] && [[ "${COMP_WORDS[2]}" =~ ^(token|sign)$ ]] && sub=${COMP_WORDS[2]}
    COMPREPLY=($(compgen -W "$("${COMP_WORDS[0]}" $cmd $sub --help 2>&1 | grep -oE -- '--[a-z][a-z0-9_.-]*' | sort -u)" -- "$cur"))
  fi
}
complete -F _surge surge
`

func cmdCompletion(args []string) error {
	if len(args) != 1 || args[0] != "bash" && args[0] != "zsh" {
		return fmt.Errorf("usage: surge completion bash|zsh (zsh: autoload bashcompinit && bashcompinit first)")
	}
	fmt.Printf(completionBash, strings.Join(commands, " "), strings.Join(components, " "))
	return nil
}
