package server

import (
	"net/http"

	"github.com/labstack/echo/v4"
)

// listOffers answers GET /v1/offers: every provider's offers in the order
// decisions try them, with the reason any is skipped (the fleet's
// OfferViews).
func (s *Server) listOffers(c echo.Context) error {
	out, err := s.fleet.OfferViews(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"offers": out})
}
