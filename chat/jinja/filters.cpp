// Jinja2's filters, as a table of functions by name: each one is what Jinja2's filter of that
// name does to a value (markup, JSON, strings, sequences, numbers, map/select/reject and their
// attr forms).
#include <algorithm>
#include <cmath>

#include "chat/jinja/internal.h"

namespace expertd::jinja {

namespace {

using Filter = Value (*)(Interp& in, const std::string& n, Value v, std::vector<Value>& a,
                         Kwargs& kw);

// Attribute lookup for filters' `attribute=` ("a.b" and integer parts, as Jinja's).
Value lookup_path(Interp& in, const Value& v, const std::string& path) {
  Value cur = v;
  size_t i = 0;
  while (i <= path.size()) {
    size_t j = path.find('.', i);
    if (j == std::string::npos) j = path.size();
    const std::string part = path.substr(i, j - i);
    const bool num = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = in.get_item(cur, num ? Value(int64_t(std::stoll(part))) : Value(part));
    i = j + 1;
  }
  return cur;
}

// default, d
Value filter_default(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& a,
                     Kwargs& kw) {
  const Value* def = arg(a, kw, 0, "default_value");
  const Value* boolean = arg(a, kw, 1, "boolean");
  const bool use = v.is_undefined() || (boolean && Interp::truthy(*boolean) && !Interp::truthy(v));
  return use ? (def ? *def : Value("")) : v;
}

// safe
Value filter_safe(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& /*a*/,
                  Kwargs& /*kw*/) {
  return v.is_safe() ? v : Value::markup(to_str(v));
}

// e, escape, forceescape
Value filter_e(Interp& /*in*/, const std::string& n, Value v, std::vector<Value>& /*a*/,
               Kwargs& /*kw*/) {
  return v.is_safe() && n != "forceescape" ? v : Value::markup(html_escape(to_str(v)));
}

// tojson
Value filter_tojson(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& a,
                    Kwargs& kw) {
  JsonOpts o;
  if (const Value* x = arg(a, kw, 0, "ensure_ascii")) o.ascii = Interp::truthy(*x);
  if (const Value* x = arg(a, kw, 1, "indent"); x && !x->is_none()) {
    if (x->is_string()) fail("TypeError: string indents are not supported");
    o.indent = int(x->i()), o.item_sep = ",";
  }
  if (const Value* x = arg(a, kw, 2, "separators"); x && !x->is_none()) {
    auto parts = Interp::iterate(*x);
    if (parts.size() != 2) fail("ValueError: separators must be a pair");
    o.item_sep = to_str(parts[0]), o.key_sep = to_str(parts[1]);
  }
  if (const Value* x = arg(a, kw, 3, "sort_keys")) o.sort = Interp::truthy(*x);
  std::string out;
  to_json(out, v, o, 0);
  return Value(out);
}

// from_json
Value filter_from_json(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& /*a*/,
                       Kwargs& /*kw*/) {
  if (!v.is_string()) fail("TypeError: the JSON object must be str, not " + type_name(v));
  auto j = nlohmann::ordered_json::parse(v.s(), nullptr, false);
  if (j.is_discarded()) fail("JSONDecodeError: invalid JSON");
  return Value::from_json(j);
}

// length, count
Value filter_length(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& /*a*/,
                    Kwargs& /*kw*/) {
  switch (v.kind()) {
    case Kind::Undefined:
      return Value(int64_t{0});
    case Kind::String:
      return Value(int64_t(code_points(v.s()).size()));
    case Kind::Array:
      if (v.is_generator()) fail("TypeError: object of type 'generator' has no len()");
      return Value(int64_t(v.arr().size()));
    case Kind::Object:
      return Value(int64_t(v.obj().items.size()));
    default:
      fail("TypeError: object of type '" + type_name(v) + "' has no len()");
  }
}

// string
// soft_str keeps Markup, and Markup's methods return Markup.
Value filter_string(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& /*a*/,
                    Kwargs& /*kw*/) {
  return v.is_string() ? v : Value(to_str(v));
}

// trim
Value filter_trim(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& a,
                  Kwargs& kw) {
  const Value* chars = arg(a, kw, 0, "chars");
  return like(v, strip_chars(to_str(v), chars, true, true));
}

// upper, lower
Value filter_upper(Interp& /*in*/, const std::string& n, Value v, std::vector<Value>& /*a*/,
                   Kwargs& /*kw*/) {
  return like(v, case_map(to_str(v), n == "upper"));
}

// title
Value filter_title(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& /*a*/,
                   Kwargs& /*kw*/) {
  return like(v, title_case(to_str(v)));
}

// capitalize
Value filter_capitalize(Interp& /*in*/, const std::string& /*n*/, Value v,
                        std::vector<Value>& /*a*/, Kwargs& /*kw*/) {
  std::string s = case_map(to_str(v), 0);
  if (!s.empty()) s[0] = char(std::toupper(static_cast<unsigned char>(s[0])));
  return like(v, s);
}

// replace
Value filter_replace(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& a,
                     Kwargs& /*kw*/) {
  if (a.size() < 2) fail("TypeError: replace needs two arguments");
  return Value(replace_all(to_str(v), to_str(a[0]), to_str(a[1]), a.size() > 2 ? a[2].i() : -1));
}

// join
Value filter_join(Interp& in, const std::string& /*n*/, Value v, std::vector<Value>& a,
                  Kwargs& kw) {
  const Value* sep = arg(a, kw, 0, "d");
  const Value* attr = arg(a, kw, 1, "attribute");
  std::string out;
  auto items = Interp::iterate(v);
  for (size_t i = 0; i < items.size(); ++i) {
    Value x = attr ? lookup_path(in, items[i], to_str(*attr)) : items[i];
    out += (i && sep ? to_str(*sep) : "") + to_str(x);
  }
  return Value(out);
}

// list
Value filter_list(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& /*a*/,
                  Kwargs& /*kw*/) {
  return Value::array(Interp::iterate(v));
}

// first, last
Value filter_first(Interp& /*in*/, const std::string& n, Value v, std::vector<Value>& /*a*/,
                   Kwargs& /*kw*/) {
  auto items = Interp::iterate(v);
  if (items.empty()) return Value::undefined("No " + n + " item, sequence was empty.");
  return n == "first" ? items.front() : items.back();
}

// reverse
Value filter_reverse(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& /*a*/,
                     Kwargs& /*kw*/) {
  if (v.is_string()) {
    auto cps = code_points(v.s());
    std::reverse(cps.begin(), cps.end());
    return Value(from_cps(cps, 0, cps.size()));
  }
  auto items = Interp::iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::array(items);
}

// items
Value filter_items(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& /*a*/,
                   Kwargs& /*kw*/) {
  if (v.is_undefined()) return Value::array();
  if (!v.is_object()) fail("TypeError: can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, e] : v.obj().items) out.push_back(Value::array({v.obj().key(k), e}, true));
  return Value::generator(out);
}

// dictsort
Value filter_dictsort(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& a,
                      Kwargs& kw) {
  if (!v.is_object()) fail("TypeError: can only dictsort a mapping.");
  const Value* cs = arg(a, kw, 0, "case_sensitive");
  const Value* by = arg(a, kw, 1, "by");
  const Value* rev = arg(a, kw, 2, "reverse");
  const bool by_value = by && to_str(*by) == "value";
  const bool case_sensitive = cs && Interp::truthy(*cs);
  std::vector<Value> out;
  for (const auto& [k, e] : v.obj().items) out.push_back(Value::array({v.obj().key(k), e}, true));
  std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
    Value kx = x.arr()[by_value], ky = y.arr()[by_value];
    if (!case_sensitive && kx.is_string()) kx = Value(case_map(kx.s(), 0));
    if (!case_sensitive && ky.is_string()) ky = Value(case_map(ky.s(), 0));
    return Interp::order(kx, ky, "<") < 0;
  });
  if (rev && Interp::truthy(*rev)) std::reverse(out.begin(), out.end());
  return Value::array(out);
}

// sort
Value filter_sort(Interp& in, const std::string& /*n*/, Value v, std::vector<Value>& a,
                  Kwargs& kw) {
  const Value* rev = arg(a, kw, 0, "reverse");
  const Value* cs = arg(a, kw, 1, "case_sensitive");
  const Value* attr = arg(a, kw, 2, "attribute");
  const bool case_sensitive = cs && Interp::truthy(*cs);
  auto items = Interp::iterate(v);
  auto key = [&](const Value& x) {
    Value k = attr ? lookup_path(in, x, to_str(*attr)) : x;
    if (!case_sensitive && k.is_string()) k = Value(case_map(k.s(), 0));
    return k;
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return Interp::order(key(x), key(y), "<") < 0;
  });
  if (rev && Interp::truthy(*rev)) std::reverse(items.begin(), items.end());
  return Value::array(items);
}

// unique
Value filter_unique(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& /*a*/,
                    Kwargs& /*kw*/) {
  std::vector<Value> out;
  for (const Value& x : Interp::iterate(v)) {
    bool seen = false;
    for (const Value& y : out) {
      Value lx = x.is_string() ? Value(case_map(x.s(), 0)) : x;
      Value ly = y.is_string() ? Value(case_map(y.s(), 0)) : y;
      seen |= Interp::equals(lx, ly);
    }
    if (!seen) out.push_back(x);
  }
  return Value::generator(out);
}

// min, max
Value filter_min(Interp& /*in*/, const std::string& n, Value v, std::vector<Value>& /*a*/,
                 Kwargs& /*kw*/) {
  auto items = Interp::iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  Value best = items[0];
  for (const Value& x : items)
    if (Interp::order(x, best, "<") * (n == "min" ? 1 : -1) < 0) best = x;
  return best;
}

// sum
Value filter_sum(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& /*a*/,
                 Kwargs& /*kw*/) {
  Value total = Value(int64_t{0});
  for (const Value& x : Interp::iterate(v)) total = Interp::binary("+", total, x);
  return total;
}

// int
Value filter_int(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& a,
                 Kwargs& kw) {
  const Value* def = arg(a, kw, 0, "default");
  if (v.kind() == Kind::Int || v.kind() == Kind::Bool) return Value(v.i());
  if (v.kind() == Kind::Float) return Value(int64_t(v.f()));
  if (v.is_string()) {
    try {
      size_t used = 0;
      std::string s = strip_chars(v.s(), nullptr, true, true);
      const int64_t r = std::stoll(s, &used);
      if (used == s.size()) return Value(r);
      return Value(int64_t(std::stod(s)));
    } catch (...) {
    }
  }
  return def ? *def : Value(int64_t{0});
}

// float
Value filter_float(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& a,
                   Kwargs& kw) {
  if (v.is_number()) return Value(v.f());
  if (v.is_string()) try {
      return Value(std::stod(v.s()));
    } catch (...) {
    }
  const Value* def = arg(a, kw, 0, "default");
  return def ? *def : Value(0.0);
}

// abs
Value filter_abs(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& /*a*/,
                 Kwargs& /*kw*/) {
  if (!v.is_number()) fail("TypeError: bad operand type for abs()");
  return v.kind() == Kind::Float ? Value(std::fabs(v.f())) : Value(std::abs(v.i()));
}

// round
Value filter_round(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& a,
                   Kwargs& kw) {
  const Value* prec = arg(a, kw, 0, "precision");
  const double p = std::pow(10.0, prec ? double(prec->i()) : 0.0);
  return Value(std::round(v.f() * p) / p);
}

// indent
Value filter_indent(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& a,
                    Kwargs& kw) {
  const Value* width = arg(a, kw, 0, "width");
  const Value* first = arg(a, kw, 1, "first");
  const Value* blank = arg(a, kw, 2, "blank");
  const std::string pad =
      width ? (width->is_string() ? width->s() : std::string(size_t(width->i()), ' '))
            : std::string(4, ' ');
  std::string s = to_str(v), out;
  const bool ind_blank = blank && Interp::truthy(*blank);
  // Jinja: newline + pad joins the lines; blank lines stay unindented unless `blank`.
  std::vector<std::string> lines;
  size_t i = 0;
  for (;;) {
    size_t j = s.find('\n', i);
    if (j == std::string::npos) {
      lines.push_back(s.substr(i));
      break;
    }
    lines.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k) out += "\n";
    const bool indent =
        (k > 0 || (first && Interp::truthy(*first))) && (ind_blank || !lines[k].empty());
    out += (indent ? pad : "") + lines[k];
  }
  return Value(out);
}

// map, select, reject, selectattr, rejectattr
Value filter_map(Interp& in, const std::string& n, Value v, std::vector<Value>& a, Kwargs& kw) {
  // Jinja2 iterates only a true value (so none gives nothing) and yields lazily.
  auto items = Interp::truthy(v) ? Interp::iterate(v) : std::vector<Value>{};
  std::vector<Value> out;
  if (n == "map") {
    const Value* attr = kwarg(kw, "attribute");
    if (attr) {
      const Value* def = kwarg(kw, "default");
      for (const Value& x : items) {
        Value r = lookup_path(in, x, to_str(*attr));
        out.push_back(r.is_undefined() && def ? *def : r);
      }
    } else {
      if (a.empty()) fail("TypeError: map needs a filter name or attribute=");
      const std::string fname = to_str(a[0]);
      if (!known_filter(fname)) fail("TemplateRuntimeError: No filter named '" + fname + "'");
      std::vector<Value> rest(a.begin() + 1, a.end());
      for (const Value& x : items) {
        auto r2 = rest;
        Kwargs k2;
        out.push_back(call_filter(in, fname, x, r2, k2));
      }
    }
    return Value::generator(out);
  }
  const bool attr_mode = n == "selectattr" || n == "rejectattr";
  const bool want = n == "select" || n == "selectattr";
  size_t ai = 0;
  std::string attr;
  if (attr_mode) {
    if (a.empty()) fail("TypeError: " + n + " needs an attribute");
    attr = to_str(a[ai++]);
  }
  std::string test = ai < a.size() ? to_str(a[ai++]) : "";
  if (!test.empty() && !known_test(test))
    fail("TemplateRuntimeError: No test named '" + test + "'");
  for (const Value& x : items) {
    Value subject = attr_mode ? lookup_path(in, x, attr) : x;
    bool r;
    if (test.empty()) {
      r = Interp::truthy(subject);
    } else {
      Expr e;
      e.k = Expr::K::Test;
      e.name = test;
      auto lit = [](Value val) {
        auto p = std::make_unique<Expr>();
        p->k = Expr::K::Lit;
        p->lit = std::move(val);
        return p;
      };
      e.a.push_back(lit(subject));
      for (size_t k = ai; k < a.size(); ++k) e.a.push_back(lit(a[k]));
      r = in.apply_test(e);
    }
    if (r == want) out.push_back(x);
  }
  return Value::generator(out);
}

// batch, slice
Value filter_batch(Interp& /*in*/, const std::string& n, Value v, std::vector<Value>& a,
                   Kwargs& /*kw*/) {
  if (a.empty()) fail("TypeError: " + n + " needs a count");
  auto items = Interp::iterate(v);
  const int64_t k = a[0].i();
  if (k <= 0) fail("ValueError: " + n + " needs a positive count");
  std::vector<Value> out;
  if (n == "batch") {
    for (size_t i = 0; i < items.size(); i += size_t(k))
      out.push_back(Value::array(std::vector<Value>(
          items.begin() + long(i), items.begin() + long(std::min(items.size(), i + size_t(k))))));
  } else {
    const size_t per = items.size() / size_t(k), extra = items.size() % size_t(k);
    size_t at = 0;
    for (int64_t s = 0; s < k; ++s) {
      const size_t len = per + (size_t(s) < extra);
      out.push_back(Value::array(
          std::vector<Value>(items.begin() + long(at), items.begin() + long(at + len))));
      at += len;
    }
  }
  return Value::array(out);
}

// wordcount
Value filter_wordcount(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& /*a*/,
                       Kwargs& /*kw*/) {
  return Value(int64_t(split(to_str(v), nullptr, -1).size()));
}

// attr
Value filter_attr(Interp& in, const std::string& /*n*/, Value v, std::vector<Value>& a,
                  Kwargs& /*kw*/) {
  return in.get_attr(v, a.empty() ? std::string() : to_str(a[0]));
}

// format
Value filter_format(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& a,
                    Kwargs& kw) {
  std::vector<Value> rest = a;
  return Value(py_format(to_str(v), rest, kw));
}

// center
Value filter_center(Interp& /*in*/, const std::string& /*n*/, Value v, std::vector<Value>& a,
                    Kwargs& /*kw*/) {
  const int64_t w = a.empty() ? 80 : a[0].i();
  std::string s = to_str(v);
  const int64_t len = int64_t(code_points(s).size());
  if (len >= w) return Value(s);
  const int64_t left = (w - len) / 2 + ((w - len) % 2 & w % 2);
  return Value(std::string(size_t(left), ' ') + s + std::string(size_t(w - len - left), ' '));
}

// Every filter by its names (an alias is one more row).
const std::map<std::string, Filter, std::less<>> kTable = {
    {"default", filter_default}, {"d", filter_default},
    {"safe", filter_safe},       {"e", filter_e},
    {"escape", filter_e},        {"forceescape", filter_e},
    {"tojson", filter_tojson},   {"from_json", filter_from_json},
    {"length", filter_length},   {"count", filter_length},
    {"string", filter_string},   {"trim", filter_trim},
    {"upper", filter_upper},     {"lower", filter_upper},
    {"title", filter_title},     {"capitalize", filter_capitalize},
    {"replace", filter_replace}, {"join", filter_join},
    {"list", filter_list},       {"first", filter_first},
    {"last", filter_first},      {"reverse", filter_reverse},
    {"items", filter_items},     {"dictsort", filter_dictsort},
    {"sort", filter_sort},       {"unique", filter_unique},
    {"min", filter_min},         {"max", filter_min},
    {"sum", filter_sum},         {"int", filter_int},
    {"float", filter_float},     {"abs", filter_abs},
    {"round", filter_round},     {"indent", filter_indent},
    {"map", filter_map},         {"select", filter_map},
    {"reject", filter_map},      {"selectattr", filter_map},
    {"rejectattr", filter_map},  {"batch", filter_batch},
    {"slice", filter_batch},     {"wordcount", filter_wordcount},
    {"attr", filter_attr},       {"format", filter_format},
    {"center", filter_center},
};

}  // namespace

Value call_filter(Interp& in, const std::string& n, Value v, std::vector<Value>& a, Kwargs& kw) {
  const auto f = kTable.find(n);
  if (f == kTable.end()) fail("TemplateRuntimeError: the filter '" + n + "' is not supported");
  return f->second(in, n, std::move(v), a, kw);
}

Value Interp::apply_filter(const Expr& f, Value v) {
  std::vector<Value> args;
  for (size_t i = 1; i < f.a.size(); ++i) args.push_back(eval(*f.a[i]));
  Kwargs kw;
  for (const auto& [k, x] : f.kw) kw.emplace_back(k, eval(*x));
  return call_filter(*this, f.name, std::move(v), args, kw);
}

}  // namespace expertd::jinja
