package instance

import (
	"net/url"
	"strings"
)

// EncodeQuery encodes connection parameters for the query of a postgres://
// URL. url.Values.Encode writes a space as '+', which libpq and pgx read as
// a plus sign: a socket directory "/run/my pg" became "/run/my+pg" (issue
// 19, F15). Spaces are percent-encoded instead; a real '+' is already %2B.
func EncodeQuery(q url.Values) string { return strings.ReplaceAll(q.Encode(), "+", "%20") }
