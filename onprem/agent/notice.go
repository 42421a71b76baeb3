package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/onprem/agentapi"
)

// Interruption notices (docs/bursting.md, "Spot interruptions"). A burst
// machine's agent watches its provider's metadata server:
//
//   - EC2 (IMDSv2): PUT /latest/api/token for a session token, then every
//     few seconds GET /latest/meta-data/spot/instance-action (404 until
//     EC2 decides to reclaim; then {"action": "terminate", "time": …},
//     about two minutes ahead) and /latest/meta-data/events/
//     recommendations/rebalance (404, or {"noticeTime": …}).
//   - GCE: GET /computeMetadata/v1/instance/preempted with
//     Metadata-Flavor: Google, held open with wait_for_change=true and
//     last_etag until the value changes from FALSE to TRUE; the machine
//     stops about 30 seconds later.
//
// On an interruption the agent sends every attempt its checkpoint signal
// (with the grace cut to fit before the reclaim), uploads the checkpoint,
// starts nothing more, and reports the notice in every heartbeat; the
// broker requeues the jobs and ends the machine. A rebalance
// recommendation only takes a checkpoint now. A metadata server that does
// not answer is a warning, never a notice.

// Default metadata endpoints and cadence.
const (
	ec2MetadataEndpoint = "http://169.254.169.254"
	gceMetadataEndpoint = "http://metadata.google.internal"
	// gcePreemptNotice is how long GCE gives a preempted machine.
	gcePreemptNotice = 30 * time.Second
	// imdsTokenTTL is the session token's lifetime we ask for.
	imdsTokenTTL = 6 * time.Hour
)

// noticeState is the agent's record of the notices it has read.
type noticeState struct {
	mu      sync.Mutex
	notices []agentapi.Notice
	// ending is set by the first interruption notice: nothing new starts.
	ending bool
	// unreachable counts consecutive failed reads (for the warning).
	unreachable int
}

// ec2NoticeEvery is how often IMDS is polled: AWS suggests every five
// seconds for a notice that comes two minutes ahead (tests shorten it).
var ec2NoticeEvery = 5 * time.Second

// Notices returns the notices read so far.
func (ag *Agent) Notices() []agentapi.Notice {
	ag.notice.mu.Lock()
	defer ag.notice.mu.Unlock()
	return append([]agentapi.Notice(nil), ag.notice.notices...)
}

// endingNow reports whether an interruption notice has been read.
func (ag *Agent) endingNow() bool {
	ag.notice.mu.Lock()
	defer ag.notice.mu.Unlock()
	return ag.notice.ending
}

// watchNotices reads the configured provider's notices until ctx ends.
func (ag *Agent) watchNotices(ctx context.Context) {
	w := ag.cfg.Notice
	if w == nil || w.Provider == "" {
		return
	}
	client := &http.Client{Timeout: 10 * time.Second}
	switch w.Provider {
	case "aws":
		ag.watchEC2(ctx, client, strings.TrimRight(cmpOr(w.Endpoint, ec2MetadataEndpoint), "/"))
	case "gcp":
		// The long poll needs no client timeout; the request carries its own.
		ag.watchGCE(ctx, &http.Client{}, strings.TrimRight(cmpOr(w.Endpoint, gceMetadataEndpoint), "/"))
	default:
		ag.log.Warn("interruption notices not watched: unknown provider", "provider", w.Provider)
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// readFailed logs the first failure of a run of them, once.
func (ag *Agent) readFailed(endpoint string, err error) {
	ag.notice.mu.Lock()
	ag.notice.unreachable++
	first := ag.notice.unreachable == 1
	ag.notice.mu.Unlock()
	if first {
		ag.log.Warn("interruption notices cannot be read: the metadata endpoint does not answer; a reclaim would come without warning",
			"endpoint", endpoint, "err", err)
	}
}

func (ag *Agent) readOK(endpoint string) {
	ag.notice.mu.Lock()
	was := ag.notice.unreachable
	ag.notice.unreachable = 0
	ag.notice.mu.Unlock()
	if was > 0 {
		ag.log.Info("interruption notices readable again", "endpoint", endpoint)
	}
}

// watchEC2 polls IMDSv2.
func (ag *Agent) watchEC2(ctx context.Context, c *http.Client, base string) {
	every := ec2NoticeEvery
	var token string
	var tokenAt time.Time
	for ctx.Err() == nil {
		err := func() error {
			if token == "" || time.Since(tokenAt) > imdsTokenTTL-time.Minute {
				t, err := imdsToken(ctx, c, base)
				if err != nil {
					return err
				}
				token, tokenAt = t, time.Now()
			}
			var action struct {
				Action string `json:"action"`
				Time   string `json:"time"`
			}
			found, err := imdsGet(ctx, c, base+"/latest/meta-data/spot/instance-action", token, &action)
			if err != nil {
				return err
			}
			if found {
				at, perr := time.Parse(time.RFC3339, action.Time)
				if perr != nil {
					return fmt.Errorf("spot/instance-action: time %q: %w", action.Time, perr)
				}
				ag.noteNotice(agentapi.Notice{Kind: agentapi.NoticeSpotInterruption, Action: action.Action, ReclaimAt: at, SeenAt: ag.now()})
			}
			var rebalance struct {
				NoticeTime string `json:"noticeTime"`
			}
			found, err = imdsGet(ctx, c, base+"/latest/meta-data/events/recommendations/rebalance", token, &rebalance)
			if err != nil {
				return err
			}
			if found {
				ag.noteNotice(agentapi.Notice{Kind: agentapi.NoticeRebalance, SeenAt: ag.now()})
			}
			return nil
		}()
		switch {
		case errors.Is(err, errIMDSToken):
			token = "" // expired or revoked: ask again next round
			ag.readFailed(base, err)
		case err != nil:
			ag.readFailed(base, err)
		default:
			ag.readOK(base)
		}
		sleep(ctx, every)
	}
}

var errIMDSToken = errors.New("imds session token refused")

func imdsToken(ctx context.Context, c *http.Client, base string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, base+"/latest/api/token", nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("X-aws-ec2-metadata-token-ttl-seconds", strconv.Itoa(int(imdsTokenTTL/time.Second)))
	resp, err := c.Do(req)
	if err != nil {
		return "", fmt.Errorf("imds token: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return "", fmt.Errorf("imds token: %w", err)
	}
	if resp.StatusCode != http.StatusOK || len(body) == 0 {
		return "", fmt.Errorf("imds token: answered %d", resp.StatusCode)
	}
	return strings.TrimSpace(string(body)), nil
}

// imdsGet reads one metadata path into out: false when the path does not
// exist (404: no notice).
func imdsGet(ctx context.Context, c *http.Client, url, token string, out any) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("X-aws-ec2-metadata-token", token)
	resp, err := c.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return false, err
	}
	switch resp.StatusCode {
	case http.StatusNotFound:
		return false, nil
	case http.StatusUnauthorized:
		return false, errIMDSToken
	case http.StatusOK:
		if err := json.Unmarshal(body, out); err != nil {
			return false, fmt.Errorf("%s: %w", url, err)
		}
		return true, nil
	}
	return false, fmt.Errorf("%s: answered %d", url, resp.StatusCode)
}

// watchGCE holds instance/preempted open with wait_for_change.
func (ag *Agent) watchGCE(ctx context.Context, c *http.Client, base string) {
	etag := ""
	backoff := time.Second
	for ctx.Err() == nil {
		url := base + "/computeMetadata/v1/instance/preempted"
		if etag != "" {
			url += "?wait_for_change=true&timeout_sec=60&last_etag=" + etag
		}
		value, tag, err := gceGet(ctx, c, url)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			ag.readFailed(base, err)
			sleep(ctx, backoff)
			backoff = min(2*backoff, 30*time.Second)
			etag = "" // read the current value again before waiting
			continue
		}
		backoff = time.Second
		ag.readOK(base)
		etag = tag
		if etag == "" {
			// A server without ETags cannot be waited on: poll gently.
			sleep(ctx, 5*time.Second)
		}
		if strings.EqualFold(value, "TRUE") {
			now := ag.now()
			ag.noteNotice(agentapi.Notice{Kind: agentapi.NoticePreempted, Action: "stop", ReclaimAt: now.Add(gcePreemptNotice), SeenAt: now})
		}
	}
}

func gceGet(ctx context.Context, c *http.Client, url string) (string, string, error) {
	rctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, url, nil)
	if err != nil {
		return "", "", err
	}
	req.Header.Set("Metadata-Flavor", "Google")
	resp, err := c.Do(req)
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return "", "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", "", fmt.Errorf("instance/preempted: answered %d", resp.StatusCode)
	}
	if resp.Header.Get("Metadata-Flavor") != "Google" {
		return "", "", errors.New("instance/preempted: the answer lacks Metadata-Flavor: Google; not the metadata server")
	}
	return strings.TrimSpace(string(body)), resp.Header.Get("ETag"), nil
}

// noteNotice records a notice once per kind and acts on it.
func (ag *Agent) noteNotice(n agentapi.Notice) {
	ag.notice.mu.Lock()
	for _, old := range ag.notice.notices {
		if old.Kind == n.Kind {
			ag.notice.mu.Unlock()
			return
		}
	}
	ag.notice.notices = append(ag.notice.notices, n)
	if n.Ending() {
		ag.notice.ending = true
	}
	ag.notice.mu.Unlock()
	ag.log.Warn("interruption notice", "kind", n.Kind, "action", n.Action, "reclaim_at", n.ReclaimAt)
	ag.mu.Lock()
	runs := make([]*run, 0, len(ag.runs))
	for _, r := range ag.runs {
		runs = append(runs, r)
	}
	ag.mu.Unlock()
	for _, r := range runs {
		if !n.Ending() {
			// At risk only: save the work now, keep running.
			ag.mu.Lock()
			proc := r.proc
			ag.mu.Unlock()
			if r.data != nil && r.a.Data.Checkpoint != nil && !r.a.Data.Checkpoint.RestoreOnly && proc != nil {
				go ag.syncCheckpoint(r, proc.Dir())
			}
			continue
		}
		grace := r.a.Grace
		if left := n.ReclaimAt.Sub(n.SeenAt); left > 0 && grace > left/2 {
			grace = left / 2 // leave the other half for the checkpoint upload
		}
		r.mu.Lock()
		if r.stopReason == "" {
			r.stopReason = agentapi.ReasonSpotReclaim
		}
		r.mu.Unlock()
		ag.stopRun(r, r.a.Signal, grace, agentapi.ReasonSpotReclaim)
	}
	ag.wake()
}
