// expertctl's views of the per-expert snapshot (Client::experts_json): `stats --experts` (a
// summary per layer) and `top` (a refreshing dashboard in the terminal).
#pragma once

#include "client/expert_client.h"

namespace expertd::ctl {

int cmd_experts_summary(client::Client& c);
// One frame and out when stdout is not a terminal; otherwise every watch_s seconds until q.
int cmd_top(client::Client& c, double watch_s);

}  // namespace expertd::ctl
