#include "engine/speculative.h"

#include <algorithm>

#include "engine/engine.h"

namespace engine {

using expertd::make_error;

expertd::Result<DraftKind> parse_draft_kind(const std::string& name) {
  if (name == "none") return DraftKind::None;
  if (name == "ngram") return DraftKind::Ngram;
  if (name == "mtp") return DraftKind::Mtp;
  return make_error("unknown draft source '" + name + "' (none, ngram or mtp)");
}

const char* draft_kind_name(DraftKind k) {
  return k == DraftKind::Ngram ? "ngram" : k == DraftKind::Mtp ? "mtp" : "none";
}

std::vector<int32_t> NgramDrafter::draft(std::span<const int32_t> h, int max,
                                         int64_t* from_out) const {
  const int64_t H = static_cast<int64_t>(h.size());
  if (from_out) *from_out = -1;
  for (int n = std::min<int64_t>(n_max, H - 1); n >= n_min && max > 0; --n) {
    const auto suffix = h.subspan(size_t(H - n));
    // The latest earlier occurrence: the one nearest the end tends to continue as the text does
    // now (the line being edited, the argument being repeated).
    for (int64_t at = H - n - 1; at >= 0; --at) {
      if (!std::equal(suffix.begin(), suffix.end(), h.begin() + at)) continue;
      const int64_t from = at + n, len = std::min<int64_t>(max, H - from);
      if (from_out) *from_out = from;
      return {h.begin() + from, h.begin() + from + len};
    }
  }
  return {};
}

void DraftLength::update(int drafted, int kept) {
  if (pause_ > 0) {
    if (--pause_ == 0) now_ = 1;
    return;
  }
  if (drafted == 0) return;
  if (kept == drafted) {
    now_ = std::min(max_, 2 * now_);
    fruitless_ = 0;
    return;
  }
  now_ = std::max(1, kept + 1);
  fruitless_ = kept == 0 ? fruitless_ + 1 : 0;
  if (fruitless_ >= patience_) pause_ = patience_, fruitless_ = 0;
}

expertd::Status speculative_step(Engine& e, int slot, std::span<const int32_t> history,
                                 const Drafter& drafter, DraftLength& len, Sampler& sampler,
                                 DraftStats& stats, DraftStep& out,
                                 const BeforeVerify& before_verify) {
  if (history.empty()) return make_error("speculative step: no pending token");
  const int past = e.n_past(slot);
  if (size_t(past) + 1 != history.size())
    return make_error("speculative step: the history does not end with the pending token");
  const int room = e.n_ctx() - past - 1;
  const int want = std::min(len.next(), room);
  out.from = -1;
  out.drafts.clear();
  if (want > 0 && drafter.kind == DraftKind::Mtp) {
    if (auto st = e.draft_nextn(slot, history.back(), want, out.drafts); !st) return st;
  } else if (want > 0) {
    out.drafts = drafter.ngram.draft(history, want, &out.from);
  }
  const int k = static_cast<int>(out.drafts.size());
  std::vector<int32_t> batch{history.back()};
  batch.insert(batch.end(), out.drafts.begin(), out.drafts.end());
  std::vector<float>& logits = out.logits;
  const SeqTokens seq{slot, batch};
  if (k > 0)
    if (auto st = e.mark(slot); !st) return st;
  if (before_verify) before_verify(out);
  if (auto st = e.eval({&seq, 1}, /*all_logits=*/true, logits); !st) return st;
  const size_t V = logits.size() / batch.size();
  out.emitted.clear();
  out.accepted = 0;
  for (int i = 0; i <= k; ++i) {
    const int32_t d = i < k ? out.drafts[size_t(i)] : -1;
    const int32_t tok = verify_row(sampler, {logits.data() + size_t(i) * V, V}, d);
    out.emitted.push_back(tok);
    if (tok != d) break;
    ++out.accepted;
  }
  if (k > 0)
    if (auto st = e.cut(slot, past + 1 + out.accepted,
                        std::span<const int32_t>(batch).first(size_t(out.accepted) + 1));
        !st)
      return st;
  if (len.max() > 0) len.update(k, out.accepted);
  ++stats.steps;
  stats.drafted += uint64_t(k);
  stats.accepted += uint64_t(out.accepted);
  stats.emitted += out.emitted.size();
  return {};
}

}  // namespace engine
