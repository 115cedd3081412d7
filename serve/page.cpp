// The page at / (serve/web.h) and the dashboard's data (serve/dashboard.h).
//
// The dashboard's data comes as server-sent events on one long response (GET
// /dashboard/events), not by polling: one connection per viewer however long the page stays open
// (no request, header parsing and key check per tick), paced by the server (kTick, from the
// snapshot that every viewer shares, made at most twice a second), and read in the page with
// fetch() so that it carries the API key in its Authorization header as every /v1/ request does
// (EventSource cannot send headers). The response ends when the viewer goes, or the server drains.
#include <thread>

#include "serve/dashboard.h"
#include "serve/server_impl.h"
#include "serve/web.h"

namespace expertd::serve {

void Server::serve_page(const WebFiles* web, Dashboard* dashboard) {
  impl_->web = web;
  impl_->dashboard = dashboard;
}

bool Server::Impl::answer_page(const std::string& path, const http::request<http::string_body>& req,
                               Conn& c) {
  if (path != "/" && path != "/index.html" && !path.starts_with("/web/") &&
      !path.starts_with("/dashboard/"))
    return false;
  auto fail = [&](const HttpError& e) {
    c.send_json(e.status, error_body(Api::OpenAI, e));
    metrics.count_request("page", e.status);
  };
  if (req.method() != http::verb::get) {
    fail({405, "invalid_request_error", "use GET"});
    return true;
  }
  if (path.starts_with("/dashboard/")) {
    if (!dashboard) {
      fail({404, "not_found_error", "no dashboard"});
    } else if (!authorized(req)) {
      fail({401, "authentication_error", "invalid API key (Authorization: Bearer or x-api-key)"});
    } else if (path == "/dashboard/info") {
      c.send_json(200, dump(dashboard->info()));
      metrics.count_request("page", 200);
    } else if (path == "/dashboard/snapshot") {
      c.send_json(200, dashboard->snapshot());
      metrics.count_request("page", 200);
    } else if (path == "/dashboard/events") {
      dashboard_events(c);
    } else {
      fail({404, "not_found_error", "no endpoint " + path});
    }
    return true;
  }
  const WebFile* f = web ? web->get(path) : nullptr;
  if (!f) {
    fail({404, "not_found_error",
          web ? "no file " + path
              : "the page's files were not found (expert-serve --web-dir; see docs/web.md)"});
    return true;
  }
  // The page names no other origin: scripts and styles only from here, fetches only to here.
  c.send(200, f->content_type, f->body,
         {{"Cache-Control", "no-cache"},
          {"X-Content-Type-Options", "nosniff"},
          {"Content-Security-Policy",
           "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
           "connect-src 'self'; frame-ancestors 'none'"}});
  metrics.count_request("page", 200);
  return true;
}

void Server::Impl::dashboard_events(Conn& c) {
  if (!dashboard->enter()) {
    c.send(503, "application/json",
           error_body(Api::OpenAI, {503, "server_error",
                                    "too many dashboards open (" +
                                        std::to_string(Dashboard::kViewersMax) + "); retry"}),
           {{"Retry-After", "5"}});
    metrics.count_request("page", 503);
    return;
  }
  struct Leave {
    Dashboard& d;
    ~Leave() { d.leave(); }
  } leave{*dashboard};
  metrics.count_request("page", 200);
  c.keep_alive = false;
  if (!c.start_stream()) return;
  const auto step = std::chrono::milliseconds(100);
  auto next = std::chrono::steady_clock::now();
  while (!stopping && !draining && !c.peer_closed()) {
    if (std::chrono::steady_clock::now() >= next) {
      if (!c.chunk("data: " + dashboard->snapshot() + "\n\n")) return;
      next = std::chrono::steady_clock::now() + Dashboard::kTick;  // a slow snapshot: no burst
    }
    std::this_thread::sleep_for(step);
  }
  c.end_stream();
}

}  // namespace expertd::serve
