package config

import (
	"cmp"
	"fmt"
	"net/url"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// TLS is how the broker serves its API (docs/security.md).
type TLS struct {
	// CertFile and KeyFile are the broker's certificate (with its chain)
	// and key, PEM. They are read again on SIGHUP.
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`
	// CAFile is the CA bundle that signed CertFile: agents pin it when
	// they enrol and burst machines get it over SSH.
	CAFile string `json:"caFile,omitempty"`
	// Insecure serves plain HTTP; the broker logs a warning at every
	// start. Only for a broker on a trusted network or behind a TLS proxy.
	Insecure bool `json:"insecure,omitempty"`
}

// Enabled reports whether the broker serves HTTPS.
func (t TLS) Enabled() bool { return t.CertFile != "" }

// Limits protect the broker from one tenant's flood and from slow clients.
type Limits struct {
	// SubmitsPerMinute is each team's sustained submit rate; SubmitBurst
	// how many may come at once. Past them a submit gets 429 with
	// Retry-After.
	SubmitsPerMinute int `json:"submitsPerMinute,omitempty"`
	SubmitBurst      int `json:"submitBurst,omitempty"`
	// MaxPendingPerTeam caps a team's pending jobs; a submit past it gets
	// 429 with Retry-After.
	MaxPendingPerTeam int `json:"maxPendingPerTeam,omitempty"`
	// ReadHeaderTimeout, ReadTimeout and IdleTimeout cut off slow or idle
	// connections (a request's headers, its whole body, an idle
	// keep-alive).
	ReadHeaderTimeout broker.Duration `json:"readHeaderTimeout,omitempty"`
	ReadTimeout       broker.Duration `json:"readTimeout,omitempty"`
	IdleTimeout       broker.Duration `json:"idleTimeout,omitempty"`
	// MaxBodyBytes caps a request body on routes without a cap of their
	// own (job specs have theirs; agents' syncs carry logs, 8Mi).
	MaxBodyBytes broker.Quantity `json:"maxBodyBytes,omitempty"`
}

// OIDC lets people log in with the site's identity provider (docs/security.md).
type OIDC struct {
	// Issuer is the provider's URL (its /.well-known/openid-configuration
	// is read at start). Empty turns OIDC off.
	Issuer string `json:"issuer,omitempty"`
	// ClientID is the broker's client at the provider; ClientSecret is
	// used by the dashboard's code flow (the CLI's device flow needs none).
	ClientID     string `json:"clientID,omitempty"`
	ClientSecret string `json:"clientSecret,omitempty"`
	// Rules map a claim of the ID token to a team and role; the first
	// rule that matches wins, a person no rule matches gets 403.
	Rules []OIDCRule `json:"rules,omitempty"`
	// SessionTTL is how long a login lasts (the broker's own session
	// token, not the provider's).
	SessionTTL broker.Duration `json:"sessionTTL,omitempty"`
}

// OIDCRule maps people whose claim holds value (equal, or an element of
// a list claim such as groups) to a role and, for role user, a team.
type OIDCRule struct {
	Claim string `json:"claim"`
	Value string `json:"value"`
	Role  string `json:"role"`
	Team  string `json:"team,omitempty"`
}

func (c *Config) applySecurityDefaults() {
	l := &c.Limits
	l.SubmitsPerMinute = cmp.Or(l.SubmitsPerMinute, 600)
	l.SubmitBurst = cmp.Or(l.SubmitBurst, 100)
	l.MaxPendingPerTeam = cmp.Or(l.MaxPendingPerTeam, 5000)
	l.ReadHeaderTimeout = cmp.Or(l.ReadHeaderTimeout, broker.Duration(10*time.Second))
	l.ReadTimeout = cmp.Or(l.ReadTimeout, broker.Duration(30*time.Second))
	l.IdleTimeout = cmp.Or(l.IdleTimeout, broker.Duration(2*time.Minute))
	l.MaxBodyBytes = cmp.Or(l.MaxBodyBytes, broker.Quantity(1<<20))
	c.OIDC.SessionTTL = cmp.Or(c.OIDC.SessionTTL, broker.Duration(12*time.Hour))
}

func (c *Config) validateSecurity(add func(field, code, format string, args ...any)) {
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		add("tls", broker.CodeInvalid, "set both certFile and keyFile, or neither")
	}
	if c.TLS.Enabled() && c.TLS.Insecure {
		add("tls.insecure", broker.CodeInvalid, "cannot be true while certFile is set")
	}
	l := c.Limits
	if l.SubmitsPerMinute < 1 || l.SubmitsPerMinute > 1_000_000 {
		add("limits.submitsPerMinute", broker.CodeOutOfRange, "must be between 1 and 1000000")
	}
	if l.SubmitBurst < 1 || l.SubmitBurst > 1_000_000 {
		add("limits.submitBurst", broker.CodeOutOfRange, "must be between 1 and 1000000")
	}
	if l.MaxPendingPerTeam < 1 || l.MaxPendingPerTeam > 10_000_000 {
		add("limits.maxPendingPerTeam", broker.CodeOutOfRange, "must be between 1 and 10000000")
	}
	for f, d := range map[string]broker.Duration{"limits.readHeaderTimeout": l.ReadHeaderTimeout,
		"limits.readTimeout": l.ReadTimeout, "limits.idleTimeout": l.IdleTimeout} {
		if d.D() < 100*time.Millisecond || d.D() > time.Hour {
			add(f, broker.CodeOutOfRange, "must be between 100ms and 1h")
		}
	}
	if l.MaxBodyBytes < 1<<10 || l.MaxBodyBytes > 64<<20 {
		add("limits.maxBodyBytes", broker.CodeOutOfRange, "must be between 1Ki and 64Mi")
	}
	o := c.OIDC
	if o.Issuer != "" {
		if u, err := url.Parse(o.Issuer); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			add("oidc.issuer", broker.CodeInvalid, "must be an https URL")
		}
		if o.ClientID == "" {
			add("oidc.clientID", broker.CodeRequired, "is required with oidc.issuer")
		}
		if len(o.Rules) == 0 {
			add("oidc.rules", broker.CodeRequired, "at least one rule is required: nobody could log in")
		}
	}
	for i, r := range o.Rules {
		f := fmt.Sprintf("oidc.rules[%d]", i)
		if r.Claim == "" {
			add(f+".claim", broker.CodeRequired, "is required (e.g. groups)")
		}
		switch r.Role {
		case RoleUser:
			if !nameRe.MatchString(r.Team) {
				add(f+".team", broker.CodeRequired, "is required for role user")
			}
		case RoleOperator, RoleFinance:
		default:
			add(f+".role", broker.CodeInvalid, "must be user, operator or finance, got %q", r.Role)
		}
	}
	if o.SessionTTL.D() < time.Minute || o.SessionTTL.D() > 30*24*time.Hour {
		add("oidc.sessionTTL", broker.CodeOutOfRange, "must be between 1m and 30 days")
	}
}
