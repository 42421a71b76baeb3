package server

import (
	"embed"
	"io/fs"
	"net/http"

	"github.com/labstack/echo/v4"
)

// uiFiles is the web dashboard: hand-written HTML, CSS and JavaScript,
// embedded in the binary. The page asks for an API token, keeps it in the
// tab's sessionStorage and calls the /v1 API with it, so the dashboard has
// exactly the caller's rights and nothing of its own.
//
//go:embed ui
var uiFiles embed.FS

// uiCSP allows the page its own files and API and nothing else: no
// inline script, no other origin.
const uiCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

func (s *Server) uiRoutes(e *echo.Echo) {
	sub, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.StripPrefix("/ui/", http.FileServer(http.FS(sub)))
	e.GET("/ui", func(c echo.Context) error { return c.Redirect(http.StatusFound, "/ui/") })
	e.GET("/ui/*", func(c echo.Context) error {
		h := c.Response().Header()
		h.Set("Content-Security-Policy", uiCSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(c.Response(), c.Request())
		return nil
	})
}
