package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
)

// postAlert sends one alert to the webhook, retrying a few times while
// ctx (the leader term's) lives.
func (f *Fleet) postAlert(ctx context.Context, url string, body any) {
	raw, err := json.Marshal(body)
	if err != nil {
		return
	}
	for attempt := 0; attempt < 3; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		req, err := http.NewRequestWithContext(actx, http.MethodPost, url, bytes.NewReader(raw))
		if err == nil {
			req.Header.Set("Content-Type", "application/json")
			var resp *http.Response
			resp, err = http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode/100 == 2 {
					cancel()
					return
				}
			}
		}
		cancel()
		f.log.Warn("alert webhook failed", "url", url, "attempt", attempt+1, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(attempt+1) * 2 * time.Second): // pacing, not ordering
		}
	}
}

// budgetAlertKey prefixes the meta keys of alerts raised
// ("budget-alert/2026-12/global/80").
const budgetAlertKey = "budget-alert/"

// checkBudgetAlertsLocked raises an alert the first time in a month a
// scope's committed spend crosses 80% and 100% of its budget: a log line,
// the gauge, and the webhook when configured.
func (f *Fleet) checkBudgetAlertsLocked(in *burst.Input) {
	month := in.Now.In(Zone(f.cfg())).Format("2006-01")
	for scope, b := range in.Budgets {
		if b.Limit <= 0 {
			continue
		}
		ratio := float64(b.Committed) / float64(b.Limit)
		f.metrics.BudgetUsed.WithLabelValues(scope).Set(ratio)
		for _, level := range []float64{0.8, 1.0} {
			key := fmt.Sprintf("%s/%s/%.0f", month, scope, level*100)
			if ratio < level || f.alerted[key] {
				continue
			}
			f.alerted[key] = true
			f.st.Go(func(ctx context.Context) {
				// Kept, so a restart does not raise the alert again.
				ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				if err := f.store.Batch(ctx, func(tx broker.Tx) error { return tx.Put(broker.BucketMeta, budgetAlertKey+key, []byte("1")) }); err != nil {
					f.log.Warn("record budget alert", "key", key, "err", err)
				}
			})
			msg := fmt.Sprintf("burst budget %s at %.0f%%: %s of %s %s committed in %s", scope, ratio*100,
				burst.Money(b.Committed), burst.Money(b.Limit), in.Currency, month)
			f.log.Warn("budget alert", "scope", scope, "level", level, "committed", b.Committed.String(), "limit", b.Limit.String(), "msg", msg)
			f.metrics.BudgetAlerts.WithLabelValues(scope, fmt.Sprintf("%.0f", level*100)).Inc()
			if url := f.cfg().Burst.AlertWebhook; url != "" {
				body := map[string]any{"scope": scope, "month": month, "level": level, "ratio": ratio,
					"committed": b.Committed.String(), "limit": b.Limit.String(), "currency": in.Currency, "message": msg}
				f.st.Go(func(ctx context.Context) { f.postAlert(ctx, url, body) })
			}
		}
	}
}
