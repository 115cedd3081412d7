// The Jinja renderer's inside (chat/jinja.h is its face), split as llama.cpp's common/jinja is:
// Python's values and strings (values.cpp), the lexer (lexer.cpp), the parser into a syntax tree
// (parser.cpp), the interpreter (interp.cpp: statements, expressions; ops.cpp: Python's
// operators, items, attributes, methods and Jinja's tests) and the filters, a table
// (filters.cpp). Errors are thrown as Error inside and returned as values at the face.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja.h"

namespace expertd::jinja {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] inline void fail(const std::string& why) {
  throw Error(why);
}

using Kind = Value::Kind;
using Kwargs = std::vector<std::pair<std::string, Value>>;

// ---- Python's formatting, strings and JSON (values.cpp) ----------------------------------------

struct JsonOpts {
  bool ascii = false, sort = false;
  int indent = -1;  // < 0: none
  std::string item_sep = ", ", key_sep = ": ";
};
std::string float_repr(double d);
uint32_t next_cp(std::string_view s, size_t& i);
void put_cp(std::string& out, uint32_t cp);
std::vector<uint32_t> code_points(std::string_view s);
std::string from_cps(const std::vector<uint32_t>& cps, size_t a, size_t b);
std::string str_repr(const std::string& s);
std::string to_str(const Value& v);
std::string repr(const Value& v);
std::string type_name(const Value& v);
std::string html_escape(const std::string& s);
Value like(const Value& like, std::string s);
void json_str(std::string& out, const std::string& s, bool ascii);
void to_json(std::string& out, const Value& v, const JsonOpts& o, int depth);
bool is_ws(char c);
std::string strip_chars(const std::string& s, const Value* chars, bool left, bool right);
std::vector<Value> split(const std::string& s, const Value* sep, int64_t maxsplit);
std::string replace_all(const std::string& s, const std::string& from, const std::string& to,
                        int64_t count);
std::string case_map(const std::string& s, int mode);
std::string title_case(const std::string& s);
std::string py_format(const std::string& fmt, const std::vector<Value>& args, const Kwargs& kw);
const Value* kwarg(const Kwargs& kw, const char* name);
const Value* arg(const std::vector<Value>& a, const Kwargs& kw, size_t i, const char* name);

// ---- tokens and the syntax tree (lexer.cpp, parser.cpp) --------------------------------------

enum class Tok : uint8_t {
  Text,
  VarBegin,
  VarEnd,
  BlockBegin,
  BlockEnd,
  Name,
  Str,
  Int,
  Float,
  Op,
  End
};
struct Token {
  Tok t;
  std::string s;
  int64_t i = 0;
  double f = 0;
  int line = 0;
};
std::vector<Token> lex(std::string_view in);

struct Expr;
using ExprP = std::unique_ptr<Expr>;
struct Expr {
  enum class K : uint8_t {
    Lit,
    Name,
    Attr,
    Item,
    Slice,
    Call,
    Filter,
    Test,
    Neg,
    Pos,
    Not,
    Bin,
    Cmp,
    And,
    Or,
    Cond,
    List,
    Tuple,
    Dict,
    Concat
  };
  K k;
  int line = 0;
  Value lit;
  std::string name;                               // Name, Attr, Filter, Test; Bin: the operator
  std::vector<ExprP> a;                           // operands, arguments
  std::vector<std::string> ops;                   // Cmp
  std::vector<std::pair<std::string, ExprP>> kw;  // keyword arguments
  bool negated = false;                           // Test
};

struct Node {
  enum class K : uint8_t {
    Body,
    Text,
    Out,
    If,
    For,
    Set,
    SetBlock,
    Macro,
    Break,
    Continue,
    FilterBlock
  };
  K k;
  int line = 0;
  std::string text;                  // Text
  ExprP e;                           // Out, For's iterable, Set's value
  std::vector<std::string> targets;  // For, Set (tuple unpacking); Set: "ns.attr" as {ns, attr}
  bool attr_target = false;
  std::vector<std::pair<ExprP, std::unique_ptr<Node>>> branches;  // If (null cond: else)
  std::unique_ptr<Node> body, else_body;                          // For, SetBlock, Macro
  ExprP cond;                                                     // For's filter
  std::vector<std::pair<std::string, ExprP>> params;              // Macro
  ExprP filter;                                                   // FilterBlock: Filter on null
  std::vector<std::unique_ptr<Node>> children;                    // Body
};

std::unique_ptr<Node> parse_tokens(std::vector<Token> tokens);
// The filters and tests a template may name (a Jinja2 filter this renderer does not run parses,
// and fails when it is applied).
bool known_filter(const std::string& name);
bool known_test(const std::string& name);

// ---- the interpreter (interp.cpp, ops.cpp) ---------------------------------------------------

struct BreakSignal {};
struct ContinueSignal {};

class Interp {
 public:
  Interp(const Value& ctx, const RenderOptions& o) : opts_(o) {
    scopes_.push_back({});
    add_globals();
    if (ctx.is_object())
      for (const auto& [k, v] : ctx.obj().items) scopes_[0][k] = v;
  }

  void exec(const Node& n, std::string& out);

  using Scope = std::map<std::string, Value>;

  Value lookup(const std::string& name);

  static bool truthy(const Value& v);
  [[noreturn]] static void undefined_error(const Value& v);
  static std::vector<Value> iterate(const Value& v);

  void exec_for(const Node& n, std::string& out);

  Value make_macro(const Node& n);

  void add_globals();

  Value eval(const Expr& e);

 public:  // the runtime's operations, for the filters and tests too
  static bool equals(const Value& a, const Value& b);
  static int order(const Value& a, const Value& b, const std::string& op);
  static bool contains(const Value& container, const Value& item);
  static bool compare(const std::string& op, const Value& l, const Value& r);

  static Value binary(const std::string& op, const Value& l, const Value& r);

  static int64_t norm_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

  Value slice(const Value& v, const Value& a, const Value& b, const Value& c);

  Value get_item(const Value& v, const Value& key);

  Value get_attr(const Value& v, const std::string& name);

  [[noreturn]] static void unsafe(const std::string& name, const Value& v);

  // The methods of Python's str, dict and list that templates call (bound to v), or undefined.
  Value get_attr_only(const Value& v, const std::string& name);

  Value apply_filter(const Expr& f, Value v);
  bool apply_test(const Expr& t);

 private:
  std::vector<Scope> scopes_;
  RenderOptions opts_;
};

// Filter n applied to v with its arguments (filters.cpp).
Value call_filter(Interp& in, const std::string& n, Value v, std::vector<Value>& a, Kwargs& kw);

}  // namespace expertd::jinja
