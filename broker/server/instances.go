package server

import (
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
)

func (s *Server) instanceViews(c echo.Context, only string) ([]api.InstanceView, error) {
	now := s.clock.Now()
	s.lock()
	var views []api.InstanceView
	for _, r := range s.fleet.RecordsLocked() {
		id := r.ID
		if only != "" && id != only {
			continue
		}
		v := api.InstanceView{InstanceRecord: r.Clone(), Currency: s.currency()}
		v.Age = broker.FormatDuration(now.Sub(r.CreatedAt).Truncate(time.Second))
		for j := range s.view.Holders(id) {
			v.RunningJobs = append(v.RunningJobs, j.ID)
		}
		for j := range s.view.Jobs() {
			if j.BoundTo(id) {
				v.WaitingJobs = append(v.WaitingJobs, j.ID)
			}
		}
		slices.Sort(v.RunningJobs)
		slices.Sort(v.WaitingJobs)
		if only == "" {
			v.Bootstrap = nil // the transcript is for describe
		}
		views = append(views, v)
	}
	s.mu.Unlock()
	slices.SortFunc(views, func(a, b api.InstanceView) int { return strings.Compare(b.ID, a.ID) })
	if len(views) == 0 {
		return views, nil
	}
	cost := map[string]billing.Amount{}
	from := views[len(views)-1].CreatedAt.Add(-time.Hour)
	err := broker.Ledger{Store: s.store}.Scan(c.Request().Context(), from, time.Time{}, func(e billing.Entry) error {
		if e.Pool.InstanceID != "" {
			cost[e.Pool.InstanceID] += e.Cost
		}
		return nil
	})
	for i := range views {
		views[i].CostSoFar = cost[views[i].ID]
	}
	return views, err
}

func (s *Server) listInstances(c echo.Context) error {
	views, err := s.instanceViews(c, "")
	if err != nil {
		return err
	}
	if views == nil {
		views = []api.InstanceView{}
	}
	return c.JSON(http.StatusOK, map[string]any{"instances": views})
}

func (s *Server) getInstance(c echo.Context) error {
	views, err := s.instanceViews(c, c.Param("id"))
	if err != nil {
		return err
	}
	if len(views) == 0 {
		// A unique prefix names the machine too, with or without "spw-".
		s.lock()
		var ids []string
		for _, r := range s.fleet.RecordsLocked() {
			ids = append(ids, r.ID)
		}
		s.mu.Unlock()
		id, perr := matchInstancePrefix(ids, c.Param("id"))
		if ae, ok := perr.(*apiError); ok {
			return ae
		}
		if perr == nil {
			if views, err = s.instanceViews(c, id); err != nil {
				return err
			}
		}
	}
	if len(views) == 0 {
		return newError(http.StatusNotFound, "not_found", "instance %s not found", clip(c.Param("id")))
	}
	return c.JSON(http.StatusOK, views[0])
}

func (s *Server) burstPlan(c echo.Context) error {
	d, in, err := s.fleet.PlanBurst(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, api.BurstPlan{Decision: d, Input: in, Providers: s.fleet.ProviderNames()})
}

func (s *Server) budgetViews(c echo.Context) ([]api.BudgetView, error) {
	month := s.clock.Now().In(s.billingZone()).Format("2006-01")
	var out []api.BudgetView
	err := s.store.View(c.Request().Context(), func(tx broker.Tx) error {
		bs, err := broker.ListBudgets(tx)
		if err != nil {
			return err
		}
		for _, b := range bs {
			m, err := broker.GetBudgetMonth(tx, month, b.Scope)
			if err != nil {
				return err
			}
			v := api.BudgetView{Budget: b, Month: month, Spent: m.Spent, Reserved: m.Reserved, Remaining: b.Limit - m.Committed()}
			if b.Limit > 0 {
				v.UsedRatio = float64(m.Committed()) / float64(b.Limit)
			}
			out = append(out, v)
		}
		return nil
	})
	return out, err
}

func (s *Server) listBudgets(c echo.Context) error {
	views, err := s.budgetViews(c)
	if err != nil {
		return err
	}
	p := principal(c)
	if p.Role == config.RoleUser {
		views = slices.DeleteFunc(views, func(v api.BudgetView) bool { return v.Scope != p.Team && v.Scope != broker.GlobalScope })
	}
	if views == nil {
		views = []api.BudgetView{}
	}
	return c.JSON(http.StatusOK, map[string]any{"budgets": views, "currency": s.currency()})
}

func (s *Server) setBudget(c echo.Context) error {
	scope := c.Param("scope")
	if scope != broker.GlobalScope && !nodeNameRe.MatchString(scope) {
		return errBadRequest("scope", broker.CodeInvalid, "must be global or a team name")
	}
	var req api.BudgetRequest
	if err := decodeBody(c, 4096, &req); err != nil {
		return err
	}
	limit, err := billing.ParseAmount(req.Limit)
	if err != nil {
		return errBadRequest("limit", broker.CodeInvalid, "%v", err)
	}
	if limit < 0 {
		return errBadRequest("limit", broker.CodeOutOfRange, "must not be negative, got %s", limit)
	}
	p := principal(c)
	var b broker.Budget
	err = s.store.Update(c.Request().Context(), func(tx broker.Tx) error {
		var err error
		b, err = broker.SetBudget(tx, scope, limit, s.currency(), p.Name, s.clock.Now())
		return err
	})
	if err != nil {
		return err
	}
	s.log.Info("burst budget set", "scope", scope, "limit", limit.String(), "currency", s.currency(), "by", p.Name)
	return c.JSON(http.StatusOK, b)
}
