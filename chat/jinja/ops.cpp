// Python's operators, comparisons, items, slices and attributes over template values, the
// methods of str, dict and list that templates call, and Jinja's tests.
#include <algorithm>
#include <cmath>

#include "chat/jinja/internal.h"

namespace expertd::jinja {

bool Interp::equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Kind::Float || b.kind() == Kind::Float) return a.f() == b.f();
    return a.i() == b.i();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::Undefined:
    case Kind::None:
      return true;
    case Kind::String:
      return a.s() == b.s();
    case Kind::Array: {
      if (a.is_tuple() != b.is_tuple() || a.arr().size() != b.arr().size()) return false;
      for (size_t i = 0; i < a.arr().size(); ++i)
        if (!equals(a.arr()[i], b.arr()[i])) return false;
      return true;
    }
    case Kind::Object: {
      if (a.is_namespace() || b.is_namespace()) return a.same(b);
      if (a.obj().items.size() != b.obj().items.size()) return false;
      for (const auto& [k, v] : a.obj().items) {
        const Value* o = b.obj().find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    }
    default:
      return a.same(b);
  }
}

int Interp::order(const Value& a, const Value& b, const std::string& op) {
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  if (a.is_number() && b.is_number()) return a.f() < b.f() ? -1 : a.f() > b.f() ? 1 : 0;
  if (a.is_string() && b.is_string()) return a.s() < b.s() ? -1 : a.s() > b.s() ? 1 : 0;
  if (a.is_array() && b.is_array()) {
    for (size_t i = 0; i < std::min(a.arr().size(), b.arr().size()); ++i)
      if (!equals(a.arr()[i], b.arr()[i])) return order(a.arr()[i], b.arr()[i], op);
    return a.arr().size() < b.arr().size() ? -1 : a.arr().size() > b.arr().size() ? 1 : 0;
  }
  fail("TypeError: '" + op + "' not supported between instances of '" + type_name(a) + "' and '" +
       type_name(b) + "'");
}

bool Interp::contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::Undefined:
      return false;
    case Kind::String:
      if (!item.is_string())
        fail("TypeError: 'in <string>' requires string as left operand, not " + type_name(item));
      return container.s().find(item.s()) != std::string::npos;
    case Kind::Array:
      for (const Value& v : container.arr())
        if (equals(v, item)) return true;
      return false;
    case Kind::Object:
      return item.is_string() && container.obj().find(item.s());
    default:
      fail("TypeError: argument of type '" + type_name(container) + "' is not iterable");
  }
}

bool Interp::compare(const std::string& op, const Value& l, const Value& r) {
  if (op == "==") return equals(l, r);
  if (op == "!=") return !equals(l, r);
  if (op == "in") return contains(r, l);
  if (op == "notin") return !contains(r, l);
  const int c = order(l, r, op);
  if (op == "<") return c < 0;
  if (op == ">") return c > 0;
  if (op == "<=") return c <= 0;
  return c >= 0;
}

Value Interp::binary(const std::string& op, const Value& l, const Value& r) {
  if (l.is_undefined()) undefined_error(l);
  if (r.is_undefined()) undefined_error(r);
  if (op == "+") {
    if (l.is_string() && r.is_string()) {
      if (l.is_safe() || r.is_safe())  // Markup + str escapes the str
        return Value::markup((l.is_safe() ? l.s() : html_escape(l.s())) +
                             (r.is_safe() ? r.s() : html_escape(r.s())));
      return Value(l.s() + r.s());
    }
    if (l.is_array() && r.is_array() && l.is_tuple() == r.is_tuple()) {
      auto items = l.arr();
      items.insert(items.end(), r.arr().begin(), r.arr().end());
      return Value::array(std::move(items), l.is_tuple());
    }
    if (l.is_string())
      fail("TypeError: can only concatenate str (not \"" + type_name(r) + "\") to str");
    if (l.is_array())
      fail("TypeError: can only concatenate list (not \"" + type_name(r) + "\") to list");
  }
  if (op == "*") {
    if ((l.is_string() || l.is_array()) && (r.kind() == Kind::Int || r.kind() == Kind::Bool)) {
      if (l.is_string()) {
        std::string s;
        for (int64_t i = 0; i < r.i(); ++i) s += l.s();
        return Value(std::move(s));
      }
      std::vector<Value> items;
      for (int64_t i = 0; i < r.i(); ++i) items.insert(items.end(), l.arr().begin(), l.arr().end());
      return Value::array(std::move(items), l.is_tuple());
    }
    if (r.is_string() && (l.kind() == Kind::Int || l.kind() == Kind::Bool)) return binary(op, r, l);
  }
  if (op == "%" && l.is_string())
    fail("TypeError: printf-style string formatting is not supported");
  if (!l.is_number() || !r.is_number())
    fail("TypeError: unsupported operand type(s) for " + op + ": '" + type_name(l) + "' and '" +
         type_name(r) + "'");
  const bool ints = l.kind() != Kind::Float && r.kind() != Kind::Float;
  if (op == "/") {
    if (r.f() == 0) fail("ZeroDivisionError: division by zero");
    return Value(l.f() / r.f());
  }
  if (op == "//" || op == "%") {
    if (r.f() == 0) fail("ZeroDivisionError: integer division or modulo by zero");
    if (ints) {
      int64_t q = l.i() / r.i(), m = l.i() % r.i();
      if (m != 0 && ((m < 0) != (r.i() < 0))) --q, m += r.i();
      return op == "//" ? Value(q) : Value(m);
    }
    const double q = std::floor(l.f() / r.f());
    return op == "//" ? Value(q) : Value(l.f() - q * r.f());
  }
  if (op == "**") {
    if (ints && r.i() >= 0) {
      int64_t p = 1;
      for (int64_t i = 0; i < r.i(); ++i) p *= l.i();
      return Value(p);
    }
    return Value(std::pow(l.f(), r.f()));
  }
  if (ints) {
    if (op == "+") return Value(l.i() + r.i());
    if (op == "-") return Value(l.i() - r.i());
    return Value(l.i() * r.i());
  }
  if (op == "+") return Value(l.f() + r.f());
  if (op == "-") return Value(l.f() - r.f());
  return Value(l.f() * r.f());
}

Value Interp::slice(const Value& v, const Value& a, const Value& b, const Value& c) {
  if (v.is_undefined()) undefined_error(v);
  auto num = [](const Value& x, int64_t def) {
    if (x.is_none() || x.is_undefined()) return def;
    if (x.kind() != Kind::Int && x.kind() != Kind::Bool)
      fail("TypeError: slice indices must be integers or None");
    return x.i();
  };
  int64_t step = num(c, 1);
  if (step == 0) fail("ValueError: slice step cannot be zero");
  std::vector<uint32_t> cps;
  int64_t n;
  if (v.is_string())
    cps = code_points(v.s()), n = int64_t(cps.size());
  else if (v.is_array())
    n = int64_t(v.arr().size());
  else
    fail("TypeError: '" + type_name(v) + "' object is not subscriptable");
  auto clamp = [&](const Value& x, int64_t def) {
    if (x.is_none() || x.is_undefined()) return def;
    int64_t i = num(x, 0);
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t start = clamp(a, step > 0 ? 0 : n - 1), stop = clamp(b, step > 0 ? n : -1);
  std::vector<int64_t> idx;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) idx.push_back(i);
  if (v.is_string()) {
    std::string s;
    for (int64_t i : idx) put_cp(s, cps[size_t(i)]);
    return Value(std::move(s));
  }
  std::vector<Value> items;
  for (int64_t i : idx) items.push_back(v.arr()[size_t(i)]);
  return Value::array(std::move(items), v.is_tuple());
}

Value Interp::get_item(const Value& v, const Value& key) {
  switch (v.kind()) {
    case Kind::Undefined:
      undefined_error(v);
    case Kind::Array:
      if (key.kind() == Kind::Int || key.kind() == Kind::Bool) {
        const int64_t i = norm_index(key.i(), int64_t(v.arr().size()));
        if (i >= 0 && i < int64_t(v.arr().size())) return v.arr()[size_t(i)];
        return Value::undefined(type_name(v) + " object has no element " + to_str(key));
      }
      break;
    case Kind::String:
      if (key.kind() == Kind::Int || key.kind() == Kind::Bool) {
        auto cps = code_points(v.s());
        const int64_t i = norm_index(key.i(), int64_t(cps.size()));
        if (i >= 0 && i < int64_t(cps.size()))
          return Value(from_cps(cps, size_t(i), size_t(i) + 1));
        return Value::undefined("str object has no element " + to_str(key));
      }
      break;
    case Kind::Object:
      if (key.is_string()) {
        if (const Value* f = v.obj().find(key.s())) return *f;
        return get_attr_only(v, key.s());
      }
      for (const auto& [text, k] : v.obj().key_values)
        if (equals(k, key)) return *v.obj().find(text);
      return Value::undefined(repr(v) + " has no element " + repr(key));
    default:
      break;
  }
  if (key.is_string()) return get_attr_only(v, key.s());
  return Value::undefined((v.is_none() ? std::string("None") : type_name(v) + " object") +
                          " has no element " + to_str(key));
}

Value Interp::get_attr(const Value& v, const std::string& name) {
  if (v.is_undefined()) undefined_error(v);
  Value m = get_attr_only(v, name);
  if (!m.is_undefined()) return m;
  if (v.is_object() && !v.is_namespace())
    if (const Value* f = v.obj().find(name)) return *f;
  if (v.is_namespace())
    if (const Value* f = v.obj().find(name)) return *f;
  if (v.is_object()) return Value::undefined("'dict object' has no attribute '" + name + "'");
  if (v.is_none()) return Value::undefined("'None' has no attribute '" + name + "'");
  return Value::undefined("'" + type_name(v) + " object' has no attribute '" + name + "'");
}

[[noreturn]] void Interp::unsafe(const std::string& name, const Value& v) {
  fail("SecurityError: access to attribute '" + name + "' of '" + type_name(v) +
       "' object is unsafe.");
}

Value Interp::get_attr_only(const Value& v, const std::string& name) {
  auto method = [&](Native f) { return Value::func(name, std::move(f)); };
  if (v.is_string()) {
    const std::string s = v.s();
    const Value self = v;
    if (name == "strip" || name == "lstrip" || name == "rstrip")
      return method([s, name, self](Interp&, std::vector<Value>& a, Kwargs&) {
        return like(
            self, strip_chars(s, a.empty() ? nullptr : &a[0], name != "rstrip", name != "lstrip"));
      });
    if (name == "split" || name == "rsplit")
      return method([s, name](Interp&, std::vector<Value>& a, Kwargs& kw) {
        const Value* sep = arg(a, kw, 0, "sep");
        const Value* mx = arg(a, kw, 1, "maxsplit");
        const int64_t m = mx ? mx->i() : -1;
        if (name == "rsplit" && m >= 0) {  // from the right
          auto all = split(s, sep, -1);
          if (int64_t(all.size()) <= m + 1) return Value::array(all);
          const std::string d = sep && !sep->is_none() ? sep->s() : " ";
          std::string head;
          const size_t keep = all.size() - size_t(m);
          for (size_t i = 0; i < keep; ++i) head += (i ? d : "") + all[i].s();
          std::vector<Value> out{Value(head)};
          out.insert(out.end(), all.begin() + long(keep), all.end());
          return Value::array(out);
        }
        return Value::array(split(s, sep, m));
      });
    if (name == "startswith" || name == "endswith")
      return method([s, name](Interp&, std::vector<Value>& a, Kwargs&) {
        if (a.empty()) fail("TypeError: " + name + " takes at least 1 argument");
        std::vector<Value> cands = a[0].is_array() ? a[0].arr() : std::vector<Value>{a[0]};
        for (const Value& c : cands) {
          if (!c.is_string()) fail("TypeError: " + name + " arg must be str or a tuple of str");
          const std::string& p = c.s();
          if (p.size() <= s.size() &&
              (name == "startswith" ? s.compare(0, p.size(), p) == 0
                                    : s.compare(s.size() - p.size(), p.size(), p) == 0))
            return Value(true);
        }
        return Value(false);
      });
    if (name == "replace")
      return method([s, self](Interp&, std::vector<Value>& a, Kwargs&) {
        if (a.size() < 2 || !a[0].is_string() || !a[1].is_string())
          fail("TypeError: replace expects two strings");
        auto esc = [&](const Value& x) {
          return self.is_safe() && !x.is_safe() ? html_escape(x.s()) : x.s();
        };
        return like(self, replace_all(s, esc(a[0]), esc(a[1]), a.size() > 2 ? a[2].i() : -1));
      });
    if (name == "upper" || name == "lower")
      return method([s, name, self](Interp&, std::vector<Value>&, Kwargs&) {
        return like(self, case_map(s, name == "upper"));
      });
    if (name == "title")
      return method([s](Interp&, std::vector<Value>&, Kwargs&) { return Value(title_case(s)); });
    if (name == "capitalize")
      return method([s](Interp&, std::vector<Value>&, Kwargs&) {
        std::string o = case_map(s, 0);
        if (!o.empty()) o[0] = char(std::toupper(static_cast<unsigned char>(o[0])));
        return Value(o);
      });
    if (name == "format")
      return method(
          [s](Interp&, std::vector<Value>& a, Kwargs& kw) { return Value(py_format(s, a, kw)); });
    if (name == "join")
      return method([s](Interp&, std::vector<Value>& a, Kwargs&) {
        std::string out;
        if (a.empty()) fail("TypeError: join takes one argument");
        auto items = iterate(a[0]);
        for (size_t i = 0; i < items.size(); ++i) {
          if (!items[i].is_string())
            fail("TypeError: sequence item " + std::to_string(i) + ": expected str instance, " +
                 type_name(items[i]) + " found");
          out += (i ? s : "") + items[i].s();
        }
        return Value(out);
      });
    if (name == "find" || name == "rfind" || name == "count" || name == "index")
      return method([s, name](Interp&, std::vector<Value>& a, Kwargs&) {
        if (a.empty() || !a[0].is_string()) fail("TypeError: " + name + " expects a string");
        const std::string& p = a[0].s();
        if (name == "count") {
          if (p.empty()) return Value(int64_t(code_points(s).size() + 1));
          int64_t n = 0;
          for (size_t i = s.find(p); i != std::string::npos; i = s.find(p, i + p.size())) ++n;
          return Value(n);
        }
        const size_t at = name == "rfind" ? s.rfind(p) : s.find(p);
        if (at == std::string::npos) {
          if (name == "index") fail("ValueError: substring not found");
          return Value(int64_t{-1});
        }
        return Value(int64_t(code_points(s.substr(0, at)).size()));
      });
    if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum" ||
        name == "islower" || name == "isupper")
      return method([s, name](Interp&, std::vector<Value>&, Kwargs&) {
        if (s.empty()) return Value(false);
        bool any_cased = false;
        for (unsigned char c : s) {
          bool ok = name == "isdigit"   ? std::isdigit(c)
                    : name == "isalpha" ? std::isalpha(c)
                    : name == "isspace" ? std::isspace(c)
                    : name == "isalnum" ? std::isalnum(c)
                    : name == "islower" ? !std::isupper(c)
                                        : !std::islower(c);
          any_cased |= std::isalpha(c) != 0;
          if (!ok) return Value(false);
        }
        return Value(name == "islower" || name == "isupper" ? any_cased : true);
      });
    if (name == "splitlines")
      return method([s](Interp&, std::vector<Value>&, Kwargs&) {
        std::vector<Value> out;
        size_t i = 0;
        while (i < s.size()) {
          size_t j = s.find('\n', i);
          if (j == std::string::npos) j = s.size();
          std::string line = s.substr(i, j - i);
          if (!line.empty() && line.back() == '\r') line.pop_back();
          out.push_back(Value(line));
          i = j + 1;
        }
        return Value::array(out);
      });
    return Value::undefined();
  }
  if (v.is_object() && !v.is_namespace()) {
    const Value self = v;
    if (name == "get")
      return method([self](Interp&, std::vector<Value>& a, Kwargs&) {
        if (a.empty()) fail("TypeError: get expected at least 1 argument, got 0");
        if (a[0].is_string())
          if (const Value* f = self.obj().find(a[0].s())) return *f;
        return a.size() > 1 ? a[1] : Value::none();
      });
    if (name == "items" || name == "keys" || name == "values")
      return method([self, name](Interp&, std::vector<Value>&, Kwargs&) {
        std::vector<Value> out;
        for (const auto& [k, e] : self.obj().items)
          out.push_back(name == "items"  ? Value::array({self.obj().key(k), e}, /*tuple=*/true)
                        : name == "keys" ? self.obj().key(k)
                                         : e);
        return Value::array(out);
      });
    if (name == "copy")
      return method([self](Interp&, std::vector<Value>&, Kwargs&) {
        Value d = Value::object();
        d.obj().items = self.obj().items;
        return d;
      });
    if (name == "pop" || name == "update" || name == "setdefault" || name == "clear" ||
        name == "popitem")
      unsafe(name, v);
    return Value::undefined();
  }
  if (v.is_array()) {
    const Value self = v;
    if (name == "index" || name == "count")
      return method([self, name](Interp&, std::vector<Value>& a, Kwargs&) {
        if (a.empty()) fail("TypeError: " + name + " takes one argument");
        int64_t n = 0;
        for (size_t i = 0; i < self.arr().size(); ++i)
          if (equals(self.arr()[i], a[0])) {
            if (name == "index") return Value(int64_t(i));
            ++n;
          }
        if (name == "index") fail("ValueError: " + repr(a[0]) + " is not in list");
        return Value(n);
      });
    if (!v.is_tuple() &&
        (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
         name == "remove" || name == "reverse" || name == "sort" || name == "clear"))
      unsafe(name, v);
    return Value::undefined();
  }
  return Value::undefined();
}

bool Interp::apply_test(const Expr& t) {
  Value v = eval(*t.a[0]);
  std::vector<Value> args;
  for (size_t i = 1; i < t.a.size(); ++i) args.push_back(eval(*t.a[i]));
  const std::string& n = t.name;
  auto need = [&](size_t k) {
    if (args.size() < k) fail("TypeError: test '" + n + "' needs an argument");
  };
  if (n == "defined") return !v.is_undefined();
  if (n == "undefined") return v.is_undefined();
  if (n == "none") return v.is_none();
  if (n == "string") return v.is_string();
  if (n == "mapping") return v.is_object() && !v.is_namespace();
  if (n == "iterable") return v.is_array() || v.is_object() || v.is_string() || v.is_undefined();
  if (n == "sequence") return v.is_array() || v.is_string() || (v.is_object() && !v.is_namespace());
  if (n == "boolean") return v.kind() == Kind::Bool;
  if (n == "true") return v.kind() == Kind::Bool && v.b();
  if (n == "false") return v.kind() == Kind::Bool && !v.b();
  if (n == "number") return v.is_number();
  if (n == "integer") return v.kind() == Kind::Int;
  if (n == "float") return v.kind() == Kind::Float;
  if (n == "callable") return v.kind() == Kind::Func;
  if (n == "lower" || n == "upper") {
    const std::string s = to_str(v);
    return s == case_map(s, n == "upper");
  }
  if (n == "odd" || n == "even" || n == "divisibleby") {
    if (v.is_undefined()) undefined_error(v);
    if (v.kind() != Kind::Int && v.kind() != Kind::Bool)
      fail("TypeError: test '" + n + "' needs an integer");
    if (n == "divisibleby") {
      need(1);
      if (args[0].i() == 0) fail("ZeroDivisionError: integer division or modulo by zero");
      return v.i() % args[0].i() == 0;
    }
    return (std::abs(v.i()) % 2 == 1) == (n == "odd");
  }
  need(1);
  if (n == "eq" || n == "equalto" || n == "==") return equals(v, args[0]);
  if (n == "ne") return !equals(v, args[0]);
  if (n == "sameas") return v.same(args[0]);
  if (n == "in") return contains(args[0], v);
  if (n == "gt" || n == "greaterthan") return order(v, args[0], ">") > 0;
  if (n == "ge") return order(v, args[0], ">=") >= 0;
  if (n == "lt" || n == "lessthan") return order(v, args[0], "<") < 0;
  if (n == "le") return order(v, args[0], "<=") <= 0;
  fail("TemplateRuntimeError: the test '" + n + "' is not supported");
}

}  // namespace expertd::jinja
