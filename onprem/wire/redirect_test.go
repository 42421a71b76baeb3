package wire

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestFinding4Redirects: the token never follows a redirect to another
// host (or from https to http), and a redirected POST stays a POST: only
// 307 and 308 are followed.
func TestFinding4Redirects(t *testing.T) {
	type seen struct{ method, auth, body string }
	var got []seen
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, seen{r.Method, r.Header.Get("Authorization"), string(b)})
		io.WriteString(w, "{}")
	}))
	defer target.Close()
	other := strings.Replace(target.URL, "127.0.0.1", "localhost", 1) // another host
	redirector := func(code int, to string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Location", to+r.RequestURI)
			w.WriteHeader(code)
		}))
	}
	post := func(cl *http.Client, url string) (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/jobs/J1/cancel", strings.NewReader("x"))
		req.Header.Set("Authorization", "Bearer secret")
		return cl.Do(req)
	}
	for _, tc := range []struct {
		name     string
		code     int
		to       string
		peers    []string
		wantErr  bool
		wantAuth string
	}{
		{"307 to another host: no token", http.StatusTemporaryRedirect, other, nil, false, ""},
		{"308 to another host: no token", http.StatusPermanentRedirect, other, nil, false, ""},
		{"307 to a named peer: token", http.StatusTemporaryRedirect, other, []string{other}, false, "Bearer secret"},
		{"307 to the same host: token", http.StatusTemporaryRedirect, target.URL, nil, false, "Bearer secret"},
		{"302 refused (would become GET)", http.StatusFound, target.URL, nil, true, ""},
		{"301 refused", http.StatusMovedPermanently, target.URL, nil, true, ""},
		{"303 refused", http.StatusSeeOther, target.URL, nil, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got = nil
			r := redirector(tc.code, tc.to)
			defer r.Close()
			resp, err := post(&http.Client{CheckRedirect: RedirectPolicy(tc.peers)}, r.URL)
			if tc.wantErr {
				if err == nil {
					resp.Body.Close()
					t.Fatalf("%d followed: target saw %+v", tc.code, got)
				}
				if len(got) != 0 {
					t.Fatalf("target was reached: %+v", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if len(got) != 1 || got[0].method != http.MethodPost || got[0].body != "x" || got[0].auth != tc.wantAuth {
				t.Fatalf("target saw %+v, want one POST with body x and Authorization %q", got, tc.wantAuth)
			}
		})
	}

	// https → http on the same hostname: no token.
	got = nil
	tlsRedirector := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", target.URL+r.RequestURI)
		w.WriteHeader(http.StatusTemporaryRedirect)
	}))
	defer tlsRedirector.Close()
	cl := tlsRedirector.Client()
	cl.CheckRedirect = RedirectPolicy(nil)
	resp, err := post(cl, tlsRedirector.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(got) != 1 || got[0].auth != "" {
		t.Fatalf("https→http redirect: target saw %+v", got)
	}
}
