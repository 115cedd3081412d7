// The interpreter: statements (output, if, for with loop, set, macros and call, filter blocks),
// the globals (range, namespace, raise_exception, strftime_now) and expressions; and the
// face (jinja.h): Template::parse and render.
#include <ctime>

#include "chat/jinja/internal.h"

namespace expertd::jinja {

void Interp::exec(const Node& n, std::string& out) {
  switch (n.k) {
    case Node::K::Body:
      for (const auto& c : n.children) exec(*c, out);
      return;
    case Node::K::Text:
      out += n.text;
      return;
    case Node::K::Out:
      out += to_str(eval(*n.e));
      return;
    case Node::K::If:
      for (const auto& [cond, body] : n.branches)
        if (!cond || truthy(eval(*cond))) {
          exec(*body, out);
          return;
        }
      return;
    case Node::K::For:
      exec_for(n, out);
      return;
    case Node::K::Set: {
      Value v = eval(*n.e);
      if (n.attr_target) {
        Value ns = lookup(n.targets[0]);
        if (!ns.is_namespace())
          fail("TemplateRuntimeError: cannot assign attribute on non-namespace object");
        ns.obj().set(n.targets[1], std::move(v));
      } else if (n.targets.size() == 1) {
        scopes_.back()[n.targets[0]] = std::move(v);
      } else {
        auto items = iterate(v);
        if (items.size() != n.targets.size())
          fail("ValueError: cannot unpack " + std::to_string(items.size()) + " values into " +
               std::to_string(n.targets.size()));
        for (size_t i = 0; i < items.size(); ++i) scopes_.back()[n.targets[i]] = items[i];
      }
      return;
    }
    case Node::K::SetBlock: {
      std::string s;
      exec(*n.body, s);
      scopes_.back()[n.targets[0]] = Value(std::move(s));
      return;
    }
    case Node::K::Macro:
      scopes_.back()[n.text] = make_macro(n);
      return;
    case Node::K::Break:
      throw BreakSignal{};
    case Node::K::Continue:
      throw ContinueSignal{};
    case Node::K::FilterBlock: {
      std::string s;
      exec(*n.body, s);
      out += to_str(apply_filter(*n.filter, Value(std::move(s))));
      return;
    }
  }
}

Value Interp::lookup(const std::string& name) {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
    auto f = it->find(name);
    if (f != it->end()) return f->second;
    if (it->count("\x01macro")) {  // a macro's scope sees its own names, then the globals
      auto g = scopes_[0].find(name);
      if (g != scopes_[0].end()) return g->second;
      break;
    }
  }
  return Value::undefined("'" + name + "' is undefined");
}

bool Interp::truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
    case Kind::Int:
      return v.i() != 0;
    case Kind::Float:
      return v.f() != 0;
    case Kind::String:
      return !v.s().empty();
    case Kind::Array:
      return v.is_generator() || !v.arr().empty();
    case Kind::Object:
      return v.is_namespace() || !v.obj().items.empty();
    case Kind::Func:
      return true;
  }
  return false;
}

[[noreturn]] void Interp::undefined_error(const Value& v) {
  fail("UndefinedError: " + (v.s().empty() ? std::string("value is undefined") : v.s()));
}

std::vector<Value> Interp::iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined:
      return {};
    case Kind::Array: {
      std::vector<Value> items = v.arr();
      if (v.is_generator()) v.arr().clear();  // one pass
      return items;
    }
    case Kind::Object: {
      std::vector<Value> keys;
      for (const auto& kv : v.obj().items) keys.push_back(v.obj().key(kv.first));
      return keys;
    }
    case Kind::String: {
      std::vector<Value> chars;
      auto cps = code_points(v.s());
      for (size_t i = 0; i < cps.size(); ++i) chars.push_back(Value(from_cps(cps, i, i + 1)));
      return chars;
    }
    default:
      fail("TypeError: '" + type_name(v) + "' object is not iterable");
  }
}

void Interp::exec_for(const Node& n, std::string& out) {
  std::vector<Value> items = iterate(eval(*n.e));
  scopes_.emplace_back();
  auto bind = [&](const Value& item) {
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = item;
      return;
    }
    auto parts = iterate(item);
    if (parts.size() != n.targets.size())
      fail("ValueError: cannot unpack " + std::to_string(parts.size()) + " values into " +
           std::to_string(n.targets.size()));
    for (size_t i = 0; i < parts.size(); ++i) scopes_.back()[n.targets[i]] = parts[i];
  };
  if (n.cond) {  // the loop's filter runs before loop.* are known
    std::vector<Value> kept;
    for (const Value& item : items) {
      bind(item);
      if (truthy(eval(*n.cond))) kept.push_back(item);
    }
    items = std::move(kept);
  }
  const int64_t len = int64_t(items.size());
  Value loop = Value::object();
  for (int64_t i = 0; i < len; ++i) {
    bind(items[i]);
    Object& l = loop.obj();
    l.items.clear();
    l.set("index0", Value(i));
    l.set("index", Value(i + 1));
    l.set("revindex0", Value(len - i - 1));
    l.set("revindex", Value(len - i));
    l.set("first", Value(i == 0));
    l.set("last", Value(i == len - 1));
    l.set("length", Value(len));
    l.set("depth", Value(1));
    l.set("depth0", Value(0));
    l.set("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
    l.set("nextitem", i + 1 < len ? items[i + 1] : Value::undefined("there is no next item"));
    l.set("cycle", Value::func("loop.cycle", [i](Interp&, std::vector<Value>& a, Kwargs&) {
            if (a.empty()) fail("TypeError: no items for cycling given");
            return a[size_t(i) % a.size()];
          }));
    scopes_.back()["loop"] = loop;
    try {
      exec(*n.body, out);
    } catch (const BreakSignal&) {
      break;
    } catch (const ContinueSignal&) {
      continue;
    }
  }
  scopes_.pop_back();
  if (len == 0 && n.else_body) exec(*n.else_body, out);
}

Value Interp::make_macro(const Node& n) {
  const Node* node = &n;
  return Value::func(n.text, [node](Interp& in, std::vector<Value>& args, Kwargs& kwargs) {
    if (args.size() > node->params.size())
      fail("TypeError: macro '" + node->text + "' takes not more than " +
           std::to_string(node->params.size()) + " argument(s)");
    Scope s;
    s["\x01macro"] = Value(true);
    for (size_t i = 0; i < node->params.size(); ++i) {
      const auto& name = node->params[i].first;
      const auto& def = node->params[i].second;
      if (i < args.size()) {
        s[name] = args[i];
      } else {
        auto kw = std::find_if(kwargs.begin(), kwargs.end(),
                               [&](const auto& p) { return p.first == name; });
        if (kw != kwargs.end())
          s[name] = kw->second;
        else if (def)
          s[name] = in.eval(*def);
        else
          s[name] = Value::undefined("'" + name + "' is undefined");
      }
    }
    for (const auto& [k, v] : kwargs) {
      bool known = false;
      for (const auto& p : node->params) known |= p.first == k;
      if (!known)
        fail("TypeError: macro '" + node->text + "' takes no keyword argument '" + k + "'");
    }
    in.scopes_.push_back(std::move(s));
    std::string out;
    try {
      in.exec(*node->body, out);
    } catch (...) {
      in.scopes_.pop_back();
      throw;
    }
    in.scopes_.pop_back();
    return Value(std::move(out));
  });
}

void Interp::add_globals() {
  Scope& g = scopes_[0];
  g["range"] = Value::func("range", [](Interp&, std::vector<Value>& a, Kwargs&) {
    int64_t start = 0, stop = 0, step = 1;
    for (const Value& v : a)
      if (v.kind() != Kind::Int && v.kind() != Kind::Bool)
        fail("TypeError: '" + type_name(v) + "' object cannot be interpreted as an integer");
    if (a.size() == 1)
      stop = a[0].i();
    else if (a.size() >= 2)
      start = a[0].i(), stop = a[1].i(), step = a.size() > 2 ? a[2].i() : 1;
    else
      fail("TypeError: range expected at least 1 argument, got 0");
    if (step == 0) fail("ValueError: range() arg 3 must not be zero");
    std::vector<Value> out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      out.push_back(Value(i));
      if (out.size() > 100000) fail("OverflowError: range too big");
    }
    return Value::array(std::move(out));
  });
  g["namespace"] = Value::func("namespace", [](Interp&, std::vector<Value>& a, Kwargs& kw) {
    Value ns = Value::object(/*is_namespace=*/true);
    for (const Value& d : a)
      if (d.is_object())
        for (const auto& [k, v] : d.obj().items) ns.obj().set(k, v);
    for (const auto& [k, v] : kw) ns.obj().set(k, v);
    return ns;
  });
  g["dict"] = Value::func("dict", [](Interp&, std::vector<Value>& a, Kwargs& kw) {
    Value d = Value::object();
    for (const Value& x : a)
      if (x.is_object())
        for (const auto& [k, v] : x.obj().items) d.obj().set(k, v);
    for (const auto& [k, v] : kw) d.obj().set(k, v);
    return d;
  });
  g["raise_exception"] =
      Value::func("raise_exception", [](Interp&, std::vector<Value>& a, Kwargs&) -> Value {
        fail("TemplateError: " + (a.empty() ? std::string() : to_str(a[0])));
      });
  g["strftime_now"] = Value::func("strftime_now", [](Interp& in, std::vector<Value>& a, Kwargs&) {
    std::tm tm{};
    if (in.opts_.now) {  // a fixed clock (tests): its UTC time
      gmtime_r(&in.opts_.now, &tm);
    } else {
      const std::time_t t = std::time(nullptr);
      localtime_r(&t, &tm);
    }
    char buf[256];
    const std::string fmt = a.empty() ? std::string() : to_str(a[0]);
    const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
    return Value(std::string(buf, n));
  });
}

Value Interp::eval(const Expr& e) {
  switch (e.k) {
    case Expr::K::Lit:
      return e.lit;
    case Expr::K::Name:
      return lookup(e.name);
    case Expr::K::Attr:
      return get_attr(eval(*e.a[0]), e.name);
    case Expr::K::Item:
      return get_item(eval(*e.a[0]), eval(*e.a[1]));
    case Expr::K::Slice: {
      Value v = eval(*e.a[0]);
      Value idx[3];
      for (int k = 0; k < 3; ++k) idx[k] = e.a[k + 1] ? eval(*e.a[k + 1]) : Value::none();
      return slice(v, idx[0], idx[1], idx[2]);
    }
    case Expr::K::Call: {
      Value f = eval(*e.a[0]);
      std::vector<Value> args;
      for (size_t i = 1; i < e.a.size(); ++i) args.push_back(eval(*e.a[i]));
      Kwargs kw;
      for (const auto& [k, x] : e.kw) kw.emplace_back(k, eval(*x));
      if (f.is_undefined()) undefined_error(f);
      if (f.kind() != Kind::Func) fail("TypeError: '" + type_name(f) + "' object is not callable");
      return f.fn()(*this, args, kw);
    }
    case Expr::K::Filter:
      return apply_filter(e, eval(*e.a[0]));
    case Expr::K::Test: {
      const bool r = apply_test(e);
      return Value(e.negated ? !r : r);
    }
    case Expr::K::Neg:
    case Expr::K::Pos: {
      Value v = eval(*e.a[0]);
      if (v.is_undefined()) undefined_error(v);
      if (!v.is_number()) fail("TypeError: bad operand type for unary -: '" + type_name(v) + "'");
      if (e.k == Expr::K::Pos) return v.kind() == Kind::Bool ? Value(v.i()) : v;
      return v.kind() == Kind::Float ? Value(-v.f()) : Value(-v.i());
    }
    case Expr::K::Not:
      return Value(!truthy(eval(*e.a[0])));
    case Expr::K::And: {
      Value l = eval(*e.a[0]);
      return truthy(l) ? eval(*e.a[1]) : l;
    }
    case Expr::K::Or: {
      Value l = eval(*e.a[0]);
      return truthy(l) ? l : eval(*e.a[1]);
    }
    case Expr::K::Cond:
      if (truthy(eval(*e.a[0]))) return eval(*e.a[1]);
      return e.a.size() > 2
                 ? eval(*e.a[2])
                 : Value::undefined("the inline if's condition is false and it has no else");
    case Expr::K::Bin:
      return binary(e.name, eval(*e.a[0]), eval(*e.a[1]));
    case Expr::K::Cmp: {
      Value l = eval(*e.a[0]);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value r = eval(*e.a[i + 1]);
        if (!compare(e.ops[i], l, r)) return Value(false);
        l = std::move(r);
      }
      return Value(true);
    }
    case Expr::K::List:
    case Expr::K::Tuple: {
      std::vector<Value> items;
      for (const auto& x : e.a) items.push_back(eval(*x));
      return Value::array(std::move(items), e.k == Expr::K::Tuple);
    }
    case Expr::K::Dict: {
      Value d = Value::object();
      for (size_t i = 0; i + 1 < e.a.size(); i += 2) {
        Value k = eval(*e.a[i]);
        const std::string text = to_str(k);
        if (!k.is_string()) d.obj().key_values.emplace_back(text, k);
        d.obj().set(text, eval(*e.a[i + 1]));
      }
      return d;
    }
    case Expr::K::Concat: {
      std::string s;
      for (const auto& x : e.a) s += to_str(eval(*x));
      return Value(std::move(s));
    }
  }
  return Value();
}

// ---- Template ------------------------------------------------------------------------------

Result<Template> Template::parse(std::string_view source) {
  try {
    Template t;
    t.root_ = parse_tokens(lex(source));
    return t;
  } catch (const Error& e) {
    return make_error(e.what());
  }
}

Result<std::string> Template::render(const Value& context, const RenderOptions& o) const {
  try {
    Interp in(context, o);
    std::string out;
    in.exec(*root_, out);
    return out;
  } catch (const Error& e) {
    return make_error(e.what());
  } catch (const BreakSignal&) {
    return make_error("TemplateSyntaxError: break outside a loop");
  } catch (const ContinueSignal&) {
    return make_error("TemplateSyntaxError: continue outside a loop");
  }
}

}  // namespace expertd::jinja
