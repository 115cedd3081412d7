// The parser: Jinja2's grammar by recursive descent into the syntax tree (internal.h); names
// an unknown filter or test, or a syntax error, with its line.
#include <set>

#include "chat/jinja/internal.h"

namespace expertd::jinja {

namespace {

const std::set<std::string> kFilters = {
    "abs",        "attr",       "batch",    "capitalize", "center",    "count",     "d",
    "default",    "dictsort",   "e",        "escape",     "first",     "float",     "forceescape",
    "format",     "from_json",  "groupby",  "indent",     "int",       "items",     "join",
    "last",       "length",     "list",     "lower",      "map",       "max",       "min",
    "reject",     "rejectattr", "replace",  "reverse",    "round",     "safe",      "select",
    "selectattr", "slice",      "sort",     "string",     "striptags", "sum",       "title",
    "tojson",     "trim",       "truncate", "unique",     "upper",     "urlencode", "wordcount",
    "wordwrap",   "xmlattr"};
const std::set<std::string> kTests = {
    "boolean", "callable", "defined",  "divisibleby", "eq",       "equalto", "escaped",
    "even",    "false",    "filter",   "float",       "ge",       "gt",      "greaterthan",
    "in",      "integer",  "iterable", "le",          "lessthan", "lower",   "lt",
    "mapping", "ne",       "none",     "number",      "odd",      "sameas",  "sequence",
    "string",  "test",     "true",     "undefined",   "upper",    "=="};

class Parser {
 public:
  explicit Parser(std::vector<Token> t) : t_(std::move(t)) {}

  std::unique_ptr<Node> parse_template() {
    auto body = parse_body({});
    if (peek().t != Tok::End) err("unexpected '" + stop_ + "'");
    return body;
  }

 private:
  const Token& peek(int k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  const Token& next() { return t_[std::min(p_++, t_.size() - 1)]; }
  [[noreturn]] void err(const std::string& why) const {
    fail("TemplateSyntaxError: line " + std::to_string(peek().line) + ": " + why);
  }
  bool is_op(const char* op, int k = 0) const { return peek(k).t == Tok::Op && peek(k).s == op; }
  bool is_name(const char* n, int k = 0) const { return peek(k).t == Tok::Name && peek(k).s == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) err(std::string("expected '") + op + "'");
    ++p_;
  }
  std::string expect_name() {
    if (peek().t != Tok::Name) err("expected a name");
    return next().s;
  }
  void expect_block_end() {
    if (peek().t != Tok::BlockEnd) err("expected the end of the tag");
    ++p_;
  }

  // Statements until a block tag whose name is in `stops` (left for the caller in stop_).
  std::unique_ptr<Node> parse_body(const std::set<std::string>& stops) {
    auto body = std::make_unique<Node>();
    body->k = Node::K::Body;
    for (;;) {
      const Token& t = peek();
      if (t.t == Tok::End) {
        if (!stops.empty()) {
          std::string end = *stops.begin();
          for (const std::string& s : stops)
            if (s.rfind("end", 0) == 0) end = s;
          err("unexpected end of template: missing '{% " + end + " %}'");
        }
        return body;
      }
      if (t.t == Tok::Text) {
        auto n = std::make_unique<Node>();
        n->k = Node::K::Text, n->text = t.s, n->line = t.line;
        body->children.push_back(std::move(n));
        ++p_;
      } else if (t.t == Tok::VarBegin) {
        ++p_;
        auto n = std::make_unique<Node>();
        n->k = Node::K::Out, n->line = t.line;
        n->e = parse_tuple_expr();
        if (peek().t != Tok::VarEnd) err("expected '}}'");
        ++p_;
        body->children.push_back(std::move(n));
      } else if (t.t == Tok::BlockBegin) {
        const std::string& kw = peek(1).t == Tok::Name ? peek(1).s : std::string();
        if (stops.count(kw)) {
          stop_ = kw;
          p_ += 2;
          return body;
        }
        ++p_;
        body->children.push_back(parse_statement());
      } else {
        err("unexpected token");
      }
    }
  }

  std::unique_ptr<Node> parse_statement() {
    const int line = peek().line;
    const std::string kw = expect_name();
    auto n = std::make_unique<Node>();
    n->line = line;
    if (kw == "if") {
      n->k = Node::K::If;
      ExprP cond = parse_expr();
      expect_block_end();
      for (;;) {
        auto b = parse_body({"elif", "else", "endif"});
        const std::string s = stop_;
        n->branches.emplace_back(std::move(cond), std::move(b));
        if (s == "endif") break;
        if (s == "elif") {
          cond = parse_expr();
          expect_block_end();
          continue;
        }
        expect_block_end();  // else
        n->branches.emplace_back(nullptr, parse_body({"endif"}));
        break;
      }
      expect_block_end();
    } else if (kw == "for") {
      n->k = Node::K::For;
      n->targets.push_back(expect_name());
      while (is_op(",")) ++p_, n->targets.push_back(expect_name());
      if (!is_name("in")) err("expected 'in'");
      ++p_;
      n->e = parse_expr(/*no_cond=*/true);
      if (is_name("if")) ++p_, n->cond = parse_expr(true);
      if (is_name("recursive")) err("recursive loops are not supported");
      expect_block_end();
      n->body = parse_body({"else", "endfor"});
      if (stop_ == "else") {
        expect_block_end();
        n->else_body = parse_body({"endfor"});
      }
      expect_block_end();
    } else if (kw == "set") {
      n->targets.push_back(expect_name());
      if (is_op(".")) {
        ++p_;
        n->targets.push_back(expect_name());
        n->attr_target = true;
      } else {
        while (is_op(",")) ++p_, n->targets.push_back(expect_name());
      }
      if (peek().t == Tok::BlockEnd) {
        if (n->attr_target || n->targets.size() != 1) err("a block set takes one name");
        ++p_;
        n->k = Node::K::SetBlock;
        n->body = parse_body({"endset"});
        expect_block_end();
      } else {
        n->k = Node::K::Set;
        expect_op("=");
        n->e = parse_tuple_expr();
        expect_block_end();
      }
    } else if (kw == "macro") {
      n->k = Node::K::Macro;
      n->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        std::string pn = expect_name();
        ExprP def;
        if (is_op("=")) ++p_, def = parse_expr();
        n->params.emplace_back(std::move(pn), std::move(def));
        if (!is_op(",")) break;
        ++p_;
      }
      expect_op(")");
      expect_block_end();
      n->body = parse_body({"endmacro"});
      if (peek().t == Tok::Name) ++p_;  // {% endmacro name %}
      expect_block_end();
    } else if (kw == "break" || kw == "continue") {
      n->k = kw == "break" ? Node::K::Break : Node::K::Continue;
      expect_block_end();
    } else if (kw == "filter") {
      n->k = Node::K::FilterBlock;
      n->filter = parse_filter_call(nullptr);
      expect_block_end();
      n->body = parse_body({"endfilter"});
      expect_block_end();
    } else if (kw == "generation") {  // Hugging Face's assistant-mask tag: its body as is
      expect_block_end();
      auto b = parse_body({"endgeneration"});
      expect_block_end();
      return b;
    } else {
      err("unknown tag '" + kw + "'");
    }
    return n;
  }

  ExprP make(Expr::K k) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->line = peek().line;
    return e;
  }

  // An expression, or several separated by commas (a tuple), as {{ }} and set accept.
  ExprP parse_tuple_expr() {
    ExprP first = parse_expr();
    if (!is_op(",")) return first;
    auto t = make(Expr::K::Tuple);
    t->a.push_back(std::move(first));
    while (is_op(",")) {
      ++p_;
      if (peek().t == Tok::BlockEnd || peek().t == Tok::VarEnd) break;
      t->a.push_back(parse_expr());
    }
    return t;
  }

  ExprP parse_expr(bool no_cond = false) {
    ExprP e = parse_or();
    if (no_cond) return e;
    while (is_name("if")) {
      ++p_;
      auto c = make(Expr::K::Cond);
      c->a.push_back(parse_or());  // test
      c->a.push_back(std::move(e));
      if (is_name("else")) {
        ++p_;
        c->a.push_back(parse_expr());
      }
      e = std::move(c);
    }
    return e;
  }
  ExprP parse_or() {
    ExprP l = parse_and();
    while (is_name("or")) {
      ++p_;
      auto n = make(Expr::K::Or);
      n->a.push_back(std::move(l));
      n->a.push_back(parse_and());
      l = std::move(n);
    }
    return l;
  }
  ExprP parse_and() {
    ExprP l = parse_not();
    while (is_name("and")) {
      ++p_;
      auto n = make(Expr::K::And);
      n->a.push_back(std::move(l));
      n->a.push_back(parse_not());
      l = std::move(n);
    }
    return l;
  }
  ExprP parse_not() {
    if (is_name("not")) {
      ++p_;
      auto n = make(Expr::K::Not);
      n->a.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    ExprP first = parse_math1();
    ExprP c;
    for (;;) {
      std::string op;
      if (peek().t == Tok::Op && (peek().s == "==" || peek().s == "!=" || peek().s == "<" ||
                                  peek().s == ">" || peek().s == "<=" || peek().s == ">="))
        op = next().s;
      else if (is_name("in"))
        ++p_, op = "in";
      else if (is_name("not") && is_name("in", 1))
        p_ += 2, op = "notin";
      else
        break;
      if (!c) {
        c = make(Expr::K::Cmp);
        c->a.push_back(std::move(first));
      }
      c->ops.push_back(op);
      c->a.push_back(parse_math1());
    }
    return c ? std::move(c) : std::move(first);
  }
  ExprP bin(const std::string& op, ExprP l, ExprP r) {
    auto n = make(Expr::K::Bin);
    n->name = op;
    n->a.push_back(std::move(l));
    n->a.push_back(std::move(r));
    return n;
  }
  ExprP parse_math1() {
    ExprP l = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = next().s;
      l = bin(op, std::move(l), parse_concat());
    }
    return l;
  }
  ExprP parse_concat() {
    ExprP l = parse_math2();
    if (!is_op("~")) return l;
    auto n = make(Expr::K::Concat);
    n->a.push_back(std::move(l));
    while (is_op("~")) ++p_, n->a.push_back(parse_math2());
    return n;
  }
  ExprP parse_math2() {
    ExprP l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = next().s;
      l = bin(op, std::move(l), parse_pow());
    }
    return l;
  }
  ExprP parse_pow() {
    ExprP l = parse_unary(true);
    while (is_op("**")) {
      ++p_;
      l = bin("**", std::move(l), parse_unary(true));
    }
    return l;
  }
  ExprP parse_unary(bool with_filter) {
    ExprP e;
    if (is_op("-") || is_op("+")) {
      const bool neg = next().s == "-";
      e = make(neg ? Expr::K::Neg : Expr::K::Pos);
      e->a.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }
  ExprP parse_primary() {
    const Token& t = peek();
    if (t.t == Tok::Name) {
      ++p_;
      if (t.s == "true" || t.s == "True" || t.s == "false" || t.s == "False") {
        auto e = make(Expr::K::Lit);
        e->lit = Value(t.s == "true" || t.s == "True");
        return e;
      }
      if (t.s == "none" || t.s == "None") {
        auto e = make(Expr::K::Lit);
        e->lit = Value::none();
        return e;
      }
      auto e = make(Expr::K::Name);
      e->name = t.s;
      return e;
    }
    if (t.t == Tok::Str) {
      std::string s;
      while (peek().t == Tok::Str) s += next().s;  // adjacent literals concatenate
      auto e = make(Expr::K::Lit);
      e->lit = Value(std::move(s));
      return e;
    }
    if (t.t == Tok::Int || t.t == Tok::Float) {
      ++p_;
      auto e = make(Expr::K::Lit);
      e->lit = t.t == Tok::Int ? Value(t.i) : Value(t.f);
      return e;
    }
    if (is_op("(")) {
      ++p_;
      if (is_op(")")) {
        ++p_;
        return make(Expr::K::Tuple);
      }
      ExprP first = parse_expr();
      if (is_op(")")) {
        ++p_;
        return first;
      }
      auto tup = make(Expr::K::Tuple);
      tup->a.push_back(std::move(first));
      while (is_op(",")) {
        ++p_;
        if (is_op(")")) break;
        tup->a.push_back(parse_expr());
      }
      expect_op(")");
      return tup;
    }
    if (is_op("[")) {
      ++p_;
      auto l = make(Expr::K::List);
      while (!is_op("]")) {
        l->a.push_back(parse_expr());
        if (!is_op(",")) break;
        ++p_;
      }
      expect_op("]");
      return l;
    }
    if (is_op("{")) {
      ++p_;
      auto d = make(Expr::K::Dict);
      while (!is_op("}")) {
        d->a.push_back(parse_expr());
        expect_op(":");
        d->a.push_back(parse_expr());
        if (!is_op(",")) break;
        ++p_;
      }
      expect_op("}");
      return d;
    }
    err("unexpected '" + (t.t == Tok::Op ? t.s : std::string("end of tag")) + "'");
  }
  void parse_args(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().t == Tok::Name && is_op("=", 1)) {
        std::string k = next().s;
        ++p_;
        call.kw.emplace_back(std::move(k), parse_expr());
      } else {
        call.a.push_back(parse_expr());
      }
      if (!is_op(",")) break;
      ++p_;
    }
    expect_op(")");
  }
  ExprP parse_postfix(ExprP e) {
    for (;;) {
      if (is_op(".")) {
        ++p_;
        auto n = make(Expr::K::Attr);
        if (peek().t == Tok::Int)
          n->k = Expr::K::Item, n->a.push_back(std::move(e)),
          n->a.push_back(std::make_unique<Expr>()), n->a[1]->k = Expr::K::Lit,
          n->a[1]->lit = Value(next().i);
        else
          n->name = expect_name(), n->a.push_back(std::move(e));
        e = std::move(n);
      } else if (is_op("[")) {
        ++p_;
        ExprP idx[3];
        bool slice = false;
        int part = 0;
        while (!is_op("]")) {
          if (is_op(":")) {
            ++p_, slice = true, ++part;
            if (part > 2) err("a slice takes at most three parts");
            continue;
          }
          idx[part] = parse_expr();
        }
        expect_op("]");
        auto n = make(slice ? Expr::K::Slice : Expr::K::Item);
        n->a.push_back(std::move(e));
        if (slice)
          for (auto& x : idx) n->a.push_back(std::move(x));
        else
          n->a.push_back(std::move(idx[0]));
        e = std::move(n);
      } else if (is_op("(")) {
        auto n = make(Expr::K::Call);
        n->a.push_back(std::move(e));
        parse_args(*n);
        e = std::move(n);
      } else {
        return e;
      }
    }
  }
  ExprP parse_filter_call(ExprP subject) {
    auto f = make(Expr::K::Filter);
    f->name = expect_name();
    while (is_op(".")) ++p_, f->name += "." + expect_name();
    if (!kFilters.count(f->name)) err("TemplateAssertionError: no filter named '" + f->name + "'");
    f->a.push_back(std::move(subject));
    if (is_op("(")) parse_args(*f);
    return f;
  }
  ExprP parse_filter_expr(ExprP e) {
    for (;;) {
      if (is_op("|")) {
        ++p_;
        e = parse_postfix(parse_filter_call(std::move(e)));
      } else if (is_name("is")) {
        ++p_;
        auto t = make(Expr::K::Test);
        if (is_name("not")) ++p_, t->negated = true;
        if (peek().t == Tok::Name)
          t->name = next().s;
        else if (is_op("=="))
          t->name = next().s;
        else
          err("expected a test name");
        if (!kTests.count(t->name)) err("TemplateAssertionError: no test named '" + t->name + "'");
        t->a.push_back(std::move(e));
        if (is_op("(")) {
          parse_args(*t);
        } else if (peek().t == Tok::Str || peek().t == Tok::Int || peek().t == Tok::Float ||
                   (peek().t == Tok::Name && !is_name("and") && !is_name("or") &&
                    !is_name("else") && !is_name("if") && !is_name("in") && !is_name("is")) ||
                   is_op("[") || is_op("{")) {
          t->a.push_back(parse_primary());  // a test's one argument without parentheses
          t->a.back() = parse_postfix(std::move(t->a.back()));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  std::string stop_;
};

}  // namespace

bool known_filter(const std::string& name) {
  return kFilters.count(name) > 0;
}

bool known_test(const std::string& name) {
  return kTests.count(name) > 0;
}

std::unique_ptr<Node> parse_tokens(std::vector<Token> tokens) {
  return Parser(std::move(tokens)).parse_template();
}

}  // namespace expertd::jinja
