package pgdata

import (
	"strings"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/secret"
)

// ConnParam is one keyword=value pair of a libpq connection string.
type ConnParam struct {
	Key, Value string
}

// ParseConninfo splits a libpq keyword/value connection string (what
// primary_conninfo holds: `user=repl password='a b' host=h`) into its
// pairs, in order. Values are bare or in single quotes, where \' and \\
// stand for ' and \ (libpq's rules).
func ParseConninfo(s string) ([]ConnParam, error) {
	var out []ConnParam
	i := 0
	space := func() {
		for i < len(s) && strings.IndexByte(" \t\n\r\f\v", s[i]) >= 0 {
			i++
		}
	}
	for {
		space()
		if i >= len(s) {
			return out, nil
		}
		start := i
		for i < len(s) && s[i] != '=' && strings.IndexByte(" \t\n\r\f\v", s[i]) < 0 {
			i++
		}
		key := s[start:i]
		space()
		if i >= len(s) || s[i] != '=' || key == "" {
			return nil, errs.New(errs.Usage, "bad connection string: missing \"=\" after %q", key)
		}
		i++
		space()
		var v strings.Builder
		if i < len(s) && s[i] == '\'' {
			i++
			closed := false
			for i < len(s) {
				c := s[i]
				i++
				if c == '\\' && i < len(s) {
					v.WriteByte(s[i])
					i++
					continue
				}
				if c == '\'' {
					closed = true
					break
				}
				v.WriteByte(c)
			}
			if !closed {
				return nil, errs.New(errs.Usage, "bad connection string: unterminated quoted value of %q", key)
			}
		} else {
			for i < len(s) && strings.IndexByte(" \t\n\r\f\v", s[i]) < 0 {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				v.WriteByte(s[i])
				i++
			}
		}
		out = append(out, ConnParam{Key: key, Value: v.String()})
	}
}

// SplitPassword splits a connection string, a URL or a libpq key=value
// string, into the string without its password and the password ("" if
// it has none); a passfile it names is left out too (URLs:
// secret.SplitURLPassword). The error never quotes the string.
func SplitPassword(conn string) (string, string, error) {
	if strings.Contains(conn, "://") {
		return secret.SplitURLPassword(conn)
	}
	ps, err := ParseConninfo(conn)
	if err != nil {
		return "", "", err
	}
	var password string
	kept := ps[:0:0]
	for _, p := range ps {
		switch p.Key {
		case "password":
			password = p.Value
		case "passfile":
		default:
			kept = append(kept, p)
		}
	}
	return FormatConninfo(kept), password, nil
}

// FormatConninfo writes pairs as a libpq keyword/value connection string,
// every value quoted (ParseConninfo reads it back).
func FormatConninfo(ps []ConnParam) string {
	parts := make([]string, 0, len(ps))
	for _, p := range ps {
		parts = append(parts, p.Key+"='"+strings.ReplaceAll(strings.ReplaceAll(p.Value, `\`, `\\`), "'", `\'`)+"'")
	}
	return strings.Join(parts, " ")
}

// WithoutPassword rewrites every primary_conninfo line of a configuration
// file's text (what pg_basebackup -R writes into postgresql.auto.conf)
// without its password and, when passfile is set, naming passfile
// instead of any passfile it named: the standby reads its password from a file outside its data
// directory, and no copy of the data directory carries it. It returns the
// password it removed (the last one), if any.
func WithoutPassword(text, passfile string) (out, password string, err error) {
	lines := strings.SplitAfter(text, "\n")
	for i, l := range lines {
		name, value, ok := parseConfLine(l)
		if !ok || name != "primary_conninfo" {
			continue
		}
		ps, err := ParseConninfo(value)
		if err != nil {
			return "", "", errs.Wrap(errs.Internal, err, "cannot read primary_conninfo")
		}
		kept := ps[:0:0]
		for _, p := range ps {
			switch p.Key {
			case "password":
				password = p.Value
			case "passfile":
				if passfile == "" {
					kept = append(kept, p)
				}
			default:
				kept = append(kept, p)
			}
		}
		if passfile != "" {
			kept = append(kept, ConnParam{Key: "passfile", Value: passfile})
		}
		nl := ""
		if strings.HasSuffix(l, "\n") {
			nl = "\n"
		}
		lines[i] = "primary_conninfo = " + QuoteConf(FormatConninfo(kept)) + nl
	}
	return strings.Join(lines, ""), password, nil
}

// PassfileLine is a line of a libpq password file that gives password to
// every connection that reads the file (`*:*:*:*:password`, with : and \
// escaped).
func PassfileLine(password string) string {
	return "*:*:*:*:" + strings.ReplaceAll(strings.ReplaceAll(password, `\`, `\\`), ":", `\:`) + "\n"
}
