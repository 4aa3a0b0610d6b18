package natsconn

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// natsContext is the part of a nats CLI context file
// (~/.config/nats/context/NAME.json, written by `nats context save`) that
// jsbridge reads. The unsupported fields are read only to refuse a context
// that sets them: connecting without them would reach another place or
// authenticate differently from what the user configured.
type natsContext struct {
	URL         string `json:"url"`
	User        string `json:"user"`
	Password    string `json:"password"`
	Token       string `json:"token"`
	Creds       string `json:"creds"`
	NKey        string `json:"nkey"`
	Cert        string `json:"cert"`
	Key         string `json:"key"`
	CA          string `json:"ca"`
	TLSFirst    bool   `json:"tls_first"`
	InboxPrefix string `json:"inbox_prefix"`

	JSDomain    string `json:"jetstream_domain"`
	JSAPIPrefix string `json:"jetstream_api_prefix"`

	SocksProxy     string `json:"socks_proxy"`
	NSC            string `json:"nsc"`
	UserJWT        string `json:"user_jwt"`
	WinCertStore   string `json:"windows_cert_store"`
	JSEventsPrefix string `json:"jetstream_event_prefix"`
}

// contextPath returns the file of the nats CLI context name: a path (it
// holds a separator or ends in .json) is taken as it is, a name is
// $XDG_CONFIG_HOME/nats/context/NAME.json, or ~/.config/... when
// XDG_CONFIG_HOME is not set, as the nats CLI does.
func contextPath(name string) (string, error) {
	if strings.ContainsRune(name, os.PathSeparator) || strings.HasSuffix(name, ".json") {
		return expandPath(name), nil
	}
	if name == "." || name == ".." {
		return "", fmt.Errorf("--context %q: not a context name", name)
	}
	dir := os.Getenv("XDG_CONFIG_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("--context %q: find the nats CLI's contexts: %w", name, err)
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "nats", "context", name+".json"), nil
}

// loadContext reads the nats CLI context name (see contextPath). Path
// fields have ~ and $VARS expanded, as the nats CLI does. Errors name the
// context and its file, never a value from it.
func loadContext(name string) (*natsContext, string, error) {
	path, err := contextPath(name)
	if err != nil {
		return nil, "", err
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, path, fmt.Errorf("--context %q: no such nats context: %s does not exist (`nats context ls` lists the saved ones)", name, path)
	}
	if err != nil {
		return nil, path, fmt.Errorf("--context %q: %w", name, err)
	}
	var c natsContext
	if err := json.Unmarshal(data, &c); err != nil {
		// The JSON error may quote a piece of the file; say only where.
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			return nil, path, fmt.Errorf("--context %q: %s is not valid JSON (at byte %d)", name, path, syn.Offset)
		}
		return nil, path, fmt.Errorf("--context %q: %s is not a nats context file", name, path)
	}
	for field, set := range map[string]bool{
		"socks_proxy": c.SocksProxy != "", "nsc": c.NSC != "", "user_jwt": c.UserJWT != "",
		"jetstream_event_prefix": c.JSEventsPrefix != "", "windows_cert_store": c.WinCertStore != "",
	} {
		if set {
			return nil, path, fmt.Errorf("--context %q: %s sets %s, which jsbridge does not support; use a context without it", name, path, field)
		}
	}
	c.Creds, c.NKey = expandPath(c.Creds), expandPath(c.NKey)
	c.Cert, c.Key, c.CA = expandPath(c.Cert), expandPath(c.Key), expandPath(c.CA)
	return &c, path, nil
}

// expandPath expands $VARS and a leading ~/ (the user's home) in path.
func expandPath(path string) string {
	path = os.ExpandEnv(path)
	if path == "~" || strings.HasPrefix(path, "~/") {
		if home, err := os.UserHomeDir(); err == nil {
			path = filepath.Join(home, path[1:])
		}
	}
	return path
}
