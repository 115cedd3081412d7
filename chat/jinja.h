// A Jinja renderer for chat templates: the subset of Jinja2 real models' templates use
// (statements if/for/set/macro/filter/break/continue/generation, Python-like values and
// methods, Jinja2's filters and tests), with the whitespace rules Hugging Face's
// apply_chat_template sets (trim_blocks, lstrip_blocks) inside its immutable sandbox. Output is
// byte-identical to Jinja2's (tests/data/templates: 70 real templates against python3-jinja2).
#pragma once

#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/result.h"

namespace expertd::jinja {

class Value;
struct Object {
  std::vector<std::pair<std::string, Value>> items;  // insertion order, as Python's dict
  // Keys that were not strings (a literal {0: ...}): their values, by their text.
  std::vector<std::pair<std::string, Value>> key_values;
  Value key(const std::string& k) const;  // the key as the template wrote it
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(const std::string& key, Value v);
};
class Interp;
using Native =
    std::function<Value(Interp&, std::vector<Value>&, std::vector<std::pair<std::string, Value>>&)>;

// A template value: Python's None, bool, int, float, str, list (and tuple), dict, a callable
// (macros, globals, bound methods), Jinja's undefined (with why it is, for the error when it is
// used) and namespace objects.
class Value {
 public:
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, Array, Object, Func };
  Value() = default;
  static Value none() { return Value(Kind::None); }
  static Value undefined(std::string why = "") {
    Value v;
    v.s_ = std::move(why);
    return v;
  }
  Value(bool b) : kind_(Kind::Bool), i_(b) {}
  Value(int v) : kind_(Kind::Int), i_(v) {}
  Value(int64_t v) : kind_(Kind::Int), i_(v) {}
  Value(double v) : kind_(Kind::Float), f_(v) {}
  Value(std::string s) : kind_(Kind::String), s_(std::move(s)) {}
  Value(const char* s) : kind_(Kind::String), s_(s) {}
  // Text marked safe (markupsafe's Markup, from |safe): what is added to it is HTML-escaped.
  static Value markup(std::string s) {
    Value v(std::move(s));
    v.safe_ = true;
    return v;
  }
  bool is_safe() const { return kind_ == Kind::String && safe_; }
  static Value array(std::vector<Value> items = {}, bool tuple = false);
  // What Jinja2's map, select, reject, unique and items filters return: a one-pass iterator,
  // always true, without a length, not JSON.
  static Value generator(std::vector<Value> items);
  static Value object(bool is_namespace = false);
  static Value func(std::string name, Native f);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_number() const {
    return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool;
  }
  bool is_array() const { return kind_ == Kind::Array; }
  bool is_object() const { return kind_ == Kind::Object; }
  bool is_namespace() const { return kind_ == Kind::Object && ns_; }
  bool is_tuple() const { return kind_ == Kind::Array && tuple_; }
  bool is_generator() const { return kind_ == Kind::Array && gen_; }
  bool b() const { return i_ != 0; }
  int64_t i() const { return i_; }
  double f() const { return kind_ == Kind::Float ? f_ : double(i_); }
  const std::string& s() const { return s_; }  // a string's text, an undefined's reason
  std::vector<Value>& arr() const { return *arr_; }
  Object& obj() const { return *obj_; }
  const Native& fn() const { return *fn_; }
  const std::string& fn_name() const { return s_; }
  bool same(const Value& o) const;  // Python's `is`

  // From JSON (object keys in their order) and back (what tojson writes is Python's json.dumps).
  static Value from_json(const nlohmann::ordered_json& j);

 private:
  explicit Value(Kind k) : kind_(k) {}
  Kind kind_ = Kind::Undefined;
  bool tuple_ = false, ns_ = false, gen_ = false, safe_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<std::vector<Value>> arr_;
  std::shared_ptr<Object> obj_;
  std::shared_ptr<Native> fn_;
};

struct Node;
struct RenderOptions {
  std::time_t now = 0;  // what strftime_now formats, as UTC (0: the clock, local time)
};

class Template {
 public:
  // Parses a template; an unknown filter or test, or a syntax error, is an error naming the line.
  static Result<Template> parse(std::string_view source);
  // Renders with the variables of `context` (an object); raise_exception, an undefined value
  // used where Jinja2 would fail, or a type error is an error naming the cause.
  Result<std::string> render(const Value& context, const RenderOptions& o = {}) const;

 private:
  std::shared_ptr<const Node> root_;
};

}  // namespace expertd::jinja
