package ops

import (
	"fmt"
	"strings"
)

// Renamed is a flag ("--replicas") or an environment variable
// ("JSBRIDGE_REPLICAS") renamed in this release. The old name stays
// accepted until the next release, with a warning naming the new one;
// RunCLI applies a binary's renames before parsing, so the grammar and
// --help know only the new names.
type Renamed struct {
	// Old is the name accepted for one more release, New the name the
	// grammar reads. A flag starts with "--"; anything else is an
	// environment variable.
	Old, New string
	// Also names, in the warning, where else the new name applies: the
	// flag's new variable, or the variable's flag (optional).
	Also string
}

// ApplyRenames rewrites the old flags of renamed in args (up to a bare
// "--": what follows is positional), as "--old v" or "--old=v", and copies
// each old environment variable that is set to its new one through lookup
// and set, unless the new one is set too (then the old one is ignored). It
// returns the rewritten args, one warning per old name used, and set's
// first error.
func ApplyRenames(renamed []Renamed, args []string, lookup func(string) (string, bool), set func(key, value string) error) ([]string, []string, error) {
	out := make([]string, len(args))
	copy(out, args)
	var warnings []string
	for _, r := range renamed {
		if strings.HasPrefix(r.Old, "--") {
			used := false
			for i, a := range out {
				if a == "--" {
					break
				}
				if a == r.Old {
					out[i], used = r.New, true
				} else if v, ok := strings.CutPrefix(a, r.Old+"="); ok {
					out[i], used = r.New+"="+v, true
				}
			}
			if used {
				warnings = append(warnings, fmt.Sprintf("%s is deprecated and will be removed in the next release: use %s%s", r.Old, r.New, also(r.Also)))
			}
			continue
		}
		old, ok := lookup(r.Old)
		if !ok {
			continue
		}
		if cur, ok := lookup(r.New); ok {
			if cur != old {
				warnings = append(warnings, fmt.Sprintf("%s=%q is ignored: %s=%q is set (%s is deprecated and will be removed in the next release)", r.Old, old, r.New, cur, r.Old))
			} else {
				warnings = append(warnings, fmt.Sprintf("%s is deprecated and will be removed in the next release: %s is set to the same value; unset %s", r.Old, r.New, r.Old))
			}
			continue
		}
		if err := set(r.New, old); err != nil {
			return nil, nil, fmt.Errorf("environment %s (from %s): %w", r.New, r.Old, err)
		}
		warnings = append(warnings, fmt.Sprintf("%s is deprecated and will be removed in the next release: use %s%s (read as %s now)", r.Old, r.New, also(r.Also), r.New))
	}
	return out, warnings, nil
}

func also(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}
