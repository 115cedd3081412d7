// expertctl's views of the per-expert snapshot (Client::experts_json): `stats --experts` (a
// summary per layer) and `top` (a refreshing dashboard in the terminal).
#pragma once

#include "client/expert_client.h"

namespace expertd::ctl {

int cmd_experts_summary(client::Client& c);

}  // namespace expertd::ctl
