package client

import (
	"encoding/json"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// DatabaseConfig is how to connect to one database, as the server sends it.
type DatabaseConfig struct {
	Host             string            `json:"host"`
	Port             int               `json:"port"`
	Username         string            `json:"username"`
	Password         string            `json:"password"`
	Database         string            `json:"database"`
	AdditionalParams map[string]string `json:"additionalParams,omitempty"`
}

// Database is a template or test database: the template's hash and how to connect.
type Database struct {
	TemplateHash string         `json:"templateHash"`
	Config       DatabaseConfig `json:"config"`
}

// TemplateDatabase is the answer to InitializeTemplate.
type TemplateDatabase struct {
	// TemplateHash is the template's hash (sent by pgfork at the top level too).
	TemplateHash string   `json:"templateHash,omitempty"`
	Database     Database `json:"database"`
}

// TestDatabase is one test database handed out by GetTestDatabase.
type TestDatabase struct {
	TemplateHash string `json:"templateHash,omitempty"`
	// ID is the small id in the database's name (v2's "number", v1's "id").
	ID int `json:"id"`
	// Token is the v2 hand-out id, unguessable: Unlock and Recreate give
	// back exactly this hand-out with it. Empty on v1.
	Token    string   `json:"token,omitempty"`
	Database Database `json:"database"`
	// Kept is how many databases of the template the server keeps for
	// inspection (Keep: their tests failed); Warning, when set, is a line
	// for the test output saying they pile up (pgfork serve only).
	Kept    int    `json:"kept,omitempty"`
	Warning string `json:"warning,omitempty"`
}

// UnmarshalJSON reads both answers: v1's {"id": 3} and v2's
// {"id": "<token>", "number": 3}.
func (t *TestDatabase) UnmarshalJSON(b []byte) error {
	var raw struct {
		TemplateHash string          `json:"templateHash"`
		ID           json.RawMessage `json:"id"`
		Number       *int            `json:"number"`
		Token        string          `json:"token"`
		Database     Database        `json:"database"`
		Kept         int             `json:"kept"`
		Warning      string          `json:"warning"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	*t = TestDatabase{TemplateHash: raw.TemplateHash, Token: raw.Token, Database: raw.Database, Kept: raw.Kept, Warning: raw.Warning}
	var token string
	switch {
	case len(raw.ID) == 0:
		return fmt.Errorf("test database without an id")
	case json.Unmarshal(raw.ID, &t.ID) == nil:
	case json.Unmarshal(raw.ID, &token) == nil:
		t.Token = token
		if raw.Number == nil {
			return fmt.Errorf("test database with hand-out id %q but no number", token)
		}
		t.ID = *raw.Number
	default:
		return fmt.Errorf("test database id %s is neither a number nor a string", raw.ID)
	}
	return nil
}

// TemplateList is the answer to ListTemplates.
type TemplateList struct {
	// Databases is the number of test databases reserved across pools.
	Databases int            `json:"databases"`
	Templates []TemplateInfo `json:"templates"`
}

// TemplateInfo is one template in a TemplateList.
type TemplateInfo struct {
	TemplateHash string `json:"templateHash"`
	// State is "initializing", "finalized" or "discarded".
	State string `json:"state"`
	// Databases counts the pool's databases by state: creating, ready,
	// in_use, dirty, recreating.
	Databases map[string]int `json:"databases"`
	Waiters   int            `json:"waiters"`
	Total     int            `json:"total"`
	Max       int            `json:"max"`
	// Kept counts the databases kept for inspection (Keep), outside Max.
	Kept int `json:"kept"`
}

// Config returns the connection details of the template database.
func (t TemplateDatabase) Config() DatabaseConfig { return t.Database.Config }

// Config returns the connection details of the test database.
func (t TestDatabase) Config() DatabaseConfig { return t.Database.Config }

// fill completes the hashes that IntegreSQL sends only inside "database".
func (t *TemplateDatabase) fill(hash string) {
	t.TemplateHash = firstNonEmpty(t.TemplateHash, t.Database.TemplateHash, hash)
	t.Database.TemplateHash = firstNonEmpty(t.Database.TemplateHash, t.TemplateHash)
}

func (t *TestDatabase) fill(hash string) {
	t.TemplateHash = firstNonEmpty(t.TemplateHash, t.Database.TemplateHash, hash)
	t.Database.TemplateHash = firstNonEmpty(t.Database.TemplateHash, t.TemplateHash)
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// ConnectionString returns a libpq keyword/value connection string
// ("host=… port=… user=… password=… dbname=…", values quoted where needed)
// accepted by pgx, lib/pq and libpq. As IntegreSQL's client does, it adds
// sslmode=disable unless AdditionalParams sets sslmode.
func (c DatabaseConfig) ConnectionString() string {
	var b strings.Builder
	kv := func(k, v string) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(quoteValue(v))
	}
	kv("host", c.Host)
	kv("port", strconv.Itoa(c.Port))
	kv("user", c.Username)
	if c.Password != "" {
		kv("password", c.Password)
	}
	kv("dbname", c.Database)
	params := c.params()
	for _, k := range sortedKeys(params) {
		kv(k, params[k])
	}
	return b.String()
}

// URL returns the connection details as a postgres:// URL. A host that is a
// Unix socket directory (starting with "/") is passed as the host parameter.
// As ConnectionString, it adds sslmode=disable unless AdditionalParams sets sslmode.
func (c DatabaseConfig) URL() string {
	u := url.URL{Scheme: "postgres", Path: "/" + c.Database}
	if c.Password != "" {
		u.User = url.UserPassword(c.Username, c.Password)
	} else if c.Username != "" {
		u.User = url.User(c.Username)
	}
	q := url.Values{}
	for k, v := range c.params() {
		q.Set(k, v)
	}
	hostport := c.Host
	if c.Port != 0 {
		hostport = c.Host + ":" + strconv.Itoa(c.Port)
		if strings.Contains(c.Host, ":") && !strings.HasPrefix(c.Host, "[") { // IPv6 literal
			hostport = "[" + c.Host + "]:" + strconv.Itoa(c.Port)
		}
	}
	if strings.HasPrefix(c.Host, "/") {
		q.Set("host", c.Host)
		hostport = ""
		if c.Port != 0 {
			q.Set("port", strconv.Itoa(c.Port))
		}
	}
	u.Host = hostport
	u.RawQuery = q.Encode()
	return u.String()
}

func (c DatabaseConfig) params() map[string]string {
	p := make(map[string]string, len(c.AdditionalParams)+1)
	for k, v := range c.AdditionalParams {
		p[k] = v
	}
	if _, ok := p["sslmode"]; !ok {
		p["sslmode"] = "disable"
	}
	return p
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// quoteValue quotes a keyword/value connection string value as libpq expects:
// single quotes when empty or containing spaces or quotes, with \ and ' escaped.
func quoteValue(v string) string {
	if v != "" && !strings.ContainsAny(v, " \t\n\r\v\f'\\") {
		return v
	}
	r := strings.NewReplacer(`\`, `\\`, `'`, `\'`)
	return "'" + r.Replace(v) + "'"
}
