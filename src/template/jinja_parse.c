/*
 * jinja_parse.c - tokens to syntax tree; see jinja_internal.h.
 *
 * A recursive-descent parser with the reference's grammar and precedence
 * (lowest first): x if c else y / x if c, or, and, not, comparisons and
 * (not) in, + - ~, * / // %, **, is-tests, |filters, unary +/-, calls and
 * member access, primaries. Argument lists take optional commas, as the
 * reference's do. Nesting depth is bounded, so no input can exhaust the
 * stack. Nodes live in the template's arena.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "template/jinja_internal.h"

typedef struct parser {
    jinja_template *tpl;
    jarena *a;
    const jtok *t;
    size_t n, cur;
    ember_error *err;
    int rc;
    int depth, max_depth;
} parser;

static int p_err(parser *P, const char *fmt, const char *arg) {
    if (P->rc) return P->rc;
    size_t pos = P->cur < P->n ? P->t[P->cur].pos : P->tpl->source_len;
    P->rc = jinja_err_at(P->err, EMBER_ERR_FORMAT, P->tpl->source, P->tpl->source_len, pos, fmt, arg ? arg : "");
    return P->rc;
}

static int p_err_at(parser *P, size_t pos, const char *fmt, const char *arg) {
    if (P->rc) return P->rc;
    P->rc = jinja_err_at(P->err, EMBER_ERR_FORMAT, P->tpl->source, P->tpl->source_len, pos, fmt, arg ? arg : "");
    return P->rc;
}

static jnode *new_node(parser *P, jnode_kind k, size_t pos) {
    jnode *x = ja_alloc(P->a, sizeof *x);
    if (!x) {
        if (!P->rc) P->rc = ember_err(P->err, P->a->failed ? P->a->failed : EMBER_ERR_NOMEM, "template: out of memory while parsing");
        return NULL;
    }
    x->kind = k;
    x->pos = pos;
    return x;
}

static bool nl_push(parser *P, jnodes *l, jnode *x) {
    /* capacity: powers of two >= 4 */
    size_t cap = 4;
    while (cap < l->n) cap *= 2;
    if (l->n == 0 || l->n == cap) {
        size_t ncap = l->n == 0 ? 4 : cap * 2;
        jnode **v = ja_grow(P->a, l->v, l->n * sizeof(jnode *), ncap * sizeof(jnode *));
        if (!v) {
            if (!P->rc) P->rc = ember_err(P->err, P->a->failed ? P->a->failed : EMBER_ERR_NOMEM, "template: out of memory while parsing");
            return false;
        }
        l->v = v;
    }
    l->v[l->n++] = x;
    return true;
}

static bool eof(parser *P) {
    return P->cur >= P->n;
}
static bool is(parser *P, jtok_type ty) {
    return P->cur < P->n && P->t[P->cur].type == ty;
}
static bool tok_is(const jtok *t, const char *s) {
    size_t l = strlen(s);
    return t->n == l && memcmp(t->s, s, l) == 0;
}
static bool is_ident(parser *P, const char *name) {
    return P->cur < P->n && P->t[P->cur].type == T_IDENT && tok_is(&P->t[P->cur], name);
}
static bool is_ident2(parser *P, const char *a, const char *b) {
    return P->cur + 1 < P->n && P->t[P->cur].type == T_IDENT && tok_is(&P->t[P->cur], a) &&
           P->t[P->cur + 1].type == T_IDENT && tok_is(&P->t[P->cur + 1], b);
}
static bool is_stmt(parser *P, const char *a, const char *b, const char *c) {
    if (P->cur + 1 >= P->n || P->t[P->cur].type != T_OPEN_STMT || P->t[P->cur + 1].type != T_IDENT) return false;
    const jtok *w = &P->t[P->cur + 1];
    return (a && tok_is(w, a)) || (b && tok_is(w, b)) || (c && tok_is(w, c));
}

static const char *tok_name(jtok_type t) {
    switch (t) {
    case T_TEXT: return "text";
    case T_OPEN_STMT: return "'{%'";
    case T_CLOSE_STMT: return "'%}'";
    case T_OPEN_EXPR: return "'{{'";
    case T_CLOSE_EXPR: return "'}}'";
    case T_OPEN_PAREN: return "'('";
    case T_CLOSE_PAREN: return "')'";
    case T_OPEN_CURLY: return "'{'";
    case T_CLOSE_CURLY: return "'}'";
    case T_OPEN_SQUARE: return "'['";
    case T_CLOSE_SQUARE: return "']'";
    case T_COMMA: return "','";
    case T_DOT: return "'.'";
    case T_COLON: return "':'";
    case T_PIPE: return "'|'";
    case T_CMP: return "comparison operator";
    case T_ADD: return "operator";
    case T_POW: return "'**'";
    case T_MUL: return "operator";
    case T_EQUALS: return "'='";
    case T_UNARY: return "unary operator";
    case T_STRING: return "string";
    case T_NUMBER: return "number";
    case T_IDENT: return "identifier";
    case T_COMMENT: return "comment";
    }
    return "token";
}

static bool expect(parser *P, jtok_type ty) {
    if (is(P, ty)) {
        P->cur++;
        return true;
    }
    if (eof(P)) {
        char what[64];
        snprintf(what, sizeof what, "%s", tok_name(ty));
        p_err(P, "unexpected end of template, expected %s", what);
    } else {
        char what[128];
        snprintf(what, sizeof what, "%s, got %s", tok_name(ty), tok_name(P->t[P->cur].type));
        p_err(P, "expected %s", what);
    }
    return false;
}

static bool expect_ident(parser *P, const char *name) {
    if (is_ident(P, name)) {
        P->cur++;
        return true;
    }
    p_err(P, "expected '%s'", name);
    return false;
}

static jnode *parse_expression(parser *P);
static jnode *parse_primary(parser *P);
static jnode *parse_any(parser *P);
static jnode *parse_call(parser *P, jnode *callee);
static jnode *parse_member(parser *P, jnode *object);

static bool enter(parser *P) {
    if (++P->depth > P->max_depth) {
        p_err(P, "template nesting is too deep%s", "");
        return false;
    }
    return true;
}

static jnode *parse_seq(parser *P, bool primary) {
    size_t pos = P->cur < P->n ? P->t[P->cur].pos : 0;
    jnode *first = primary ? parse_primary(P) : parse_expression(P);
    if (!first) return NULL;
    if (!is(P, T_COMMA)) return first;
    jnode *tup = new_node(P, N_TUPLE, pos);
    if (!tup || !nl_push(P, &tup->list, first)) return NULL;
    while (is(P, T_COMMA)) {
        P->cur++;
        jnode *x = primary ? parse_primary(P) : parse_expression(P);
        if (!x || !nl_push(P, &tup->list, x)) return NULL;
    }
    return tup;
}

/* Parses an argument list after '(' up to ')'; mode_params: macro parameters. */
static bool parse_args(parser *P, jnodes *out, bool mode_params) {
    if (!expect(P, T_OPEN_PAREN)) return false;
    bool saw_kw = false, saw_spread = false;
    while (!is(P, T_CLOSE_PAREN)) {
        if (eof(P)) {
            p_err(P, "unexpected end of template in an argument list%s", "");
            return false;
        }
        size_t pos = P->t[P->cur].pos;
        bool kwspread = is(P, T_POW);
        bool spread = is(P, T_MUL) && tok_is(&P->t[P->cur], "*");
        if (mode_params && (kwspread || spread)) {
            p_err(P, "argument unpacking is not allowed in parameter declarations%s", "");
            return false;
        }
        if (kwspread) {
            P->cur++;
            jnode *x = new_node(P, N_KWSPREAD, pos);
            if (!x || !(x->a = parse_expression(P)) || !nl_push(P, out, x)) return false;
            if (is(P, T_COMMA)) P->cur++;
            if (!is(P, T_CLOSE_PAREN)) {
                p_err(P, "expected ')': '**' must be applied to the final argument%s", "");
                return false;
            }
            break;
        }
        jnode *arg;
        if (spread) {
            if (saw_spread) {
                p_err(P, "only one '*' argument unpacking is allowed%s", "");
                return false;
            }
            saw_spread = true;
            P->cur++;
            arg = new_node(P, N_SPREAD, pos);
            if (!arg || !(arg->a = parse_expression(P))) return false;
        } else {
            arg = parse_expression(P);
            if (!arg) return false;
            if (is(P, T_EQUALS)) {
                size_t epos = P->t[P->cur].pos;
                P->cur++;
                if (arg->kind != N_IDENT) {
                    p_err_at(P, epos, "%s",
                             mode_params ? "expected an identifier for a parameter declaration"
                                         : "expected an identifier for a keyword argument");
                    return false;
                }
                jnode *kw = new_node(P, N_KWARG, arg->pos);
                if (!kw) return false;
                kw->s = arg->s;
                kw->n = arg->n;
                if (!(kw->b = parse_expression(P))) return false;
                arg = kw;
            }
            if (mode_params) {
                if (arg->kind != N_IDENT && arg->kind != N_KWARG) {
                    p_err_at(P, arg->pos, "expected an identifier for a parameter declaration%s", "");
                    return false;
                }
                for (size_t i = 0; i < out->n; i++)
                    if (out->v[i]->n == arg->n && memcmp(out->v[i]->s, arg->s, arg->n) == 0) {
                        char nm[64];
                        snprintf(nm, sizeof nm, "%.*s", (int)EMBER_MIN(arg->n, 60), arg->s);
                        p_err_at(P, arg->pos, "duplicate parameter name '%s'", nm);
                        return false;
                    }
            }
            if (arg->kind == N_KWARG) {
                saw_kw = true;
            } else if (saw_kw) {
                p_err_at(P, arg->pos, "%s",
                         mode_params ? "non-default argument follows default argument"
                                     : "positional arguments must come before keyword arguments");
                return false;
            } else if (saw_spread) {
                p_err_at(P, arg->pos, "positional arguments must not follow '*' argument unpacking%s", "");
                return false;
            }
        }
        if (!nl_push(P, out, arg)) return false;
        if (is(P, T_COMMA)) P->cur++;
    }
    return expect(P, T_CLOSE_PAREN);
}

static jnode *parse_primary(parser *P) {
    if (eof(P)) {
        p_err(P, "unexpected end of template, expected an expression%s", "");
        return NULL;
    }
    if (!enter(P)) return NULL;
    const jtok *tk = &P->t[P->cur++];
    jnode *x = NULL;
    switch (tk->type) {
    case T_NUMBER: {
        bool is_float = memchr(tk->s, '.', tk->n) != NULL;
        x = new_node(P, is_float ? N_FLOAT : N_INT, tk->pos);
        if (!x) break;
        char buf[64];
        if (tk->n >= sizeof buf) {
            /* a very long digit run: strtod on an arena copy */
            char *c = ja_strdup(P->a, tk->s, tk->n);
            if (!c) {
                x = NULL;
                P->rc = ember_err(P->err, EMBER_ERR_NOMEM, "template: out of memory while parsing");
                break;
            }
            x->num = strtod(c, NULL);
        } else {
            memcpy(buf, tk->s, tk->n);
            buf[tk->n] = '\0';
            x->num = strtod(buf, NULL);
        }
        break;
    }
    case T_STRING: {
        x = new_node(P, N_TEXT, tk->pos);
        if (!x) break;
        if (!is(P, T_STRING)) {
            x->s = tk->s;
            x->n = tk->n;
            break;
        }
        size_t total = tk->n, k = P->cur;
        while (k < P->n && P->t[k].type == T_STRING) total += P->t[k++].n;
        char *buf = ja_alloc(P->a, total + 1);
        if (!buf) {
            x = NULL;
            P->rc = ember_err(P->err, EMBER_ERR_NOMEM, "template: out of memory while parsing");
            break;
        }
        size_t o = 0;
        memcpy(buf, tk->s, tk->n);
        o = tk->n;
        while (is(P, T_STRING)) {
            memcpy(buf + o, P->t[P->cur].s, P->t[P->cur].n);
            o += P->t[P->cur].n;
            P->cur++;
        }
        x->s = buf;
        x->n = o;
        break;
    }
    case T_IDENT:
        x = new_node(P, N_IDENT, tk->pos);
        if (x) {
            x->s = tk->s;
            x->n = tk->n;
        }
        break;
    case T_OPEN_PAREN:
        x = parse_seq(P, false);
        if (x && !expect(P, T_CLOSE_PAREN)) x = NULL;
        break;
    case T_OPEN_SQUARE:
        x = new_node(P, N_ARRAY, tk->pos);
        while (x && !is(P, T_CLOSE_SQUARE)) {
            jnode *e = parse_expression(P);
            if (!e || !nl_push(P, &x->list, e)) {
                x = NULL;
                break;
            }
            if (is(P, T_COMMA)) P->cur++;
        }
        if (x) P->cur++;
        break;
    case T_OPEN_CURLY:
        x = new_node(P, N_OBJECT, tk->pos);
        while (x && !is(P, T_CLOSE_CURLY)) {
            jnode *k = parse_expression(P);
            if (!k || !expect(P, T_COLON)) {
                x = NULL;
                break;
            }
            jnode *v = parse_expression(P);
            if (!v || !nl_push(P, &x->list, k) || !nl_push(P, &x->list2, v)) {
                x = NULL;
                break;
            }
            if (is(P, T_COMMA)) P->cur++;
        }
        if (x) P->cur++;
        break;
    default:
        P->cur--;
        p_err(P, "unexpected %s", tok_name(tk->type));
        P->cur++;
        break;
    }
    P->depth--;
    return x;
}

static jnode *parse_member_args(parser *P, size_t pos) {
    jnode *sl[3] = {NULL, NULL, NULL};
    size_t ns = 0;
    bool is_slice = false;
    while (!is(P, T_CLOSE_SQUARE)) {
        if (eof(P)) {
            p_err(P, "unexpected end of template, expected ']'%s", "");
            return NULL;
        }
        jnode *x = NULL;
        if (is(P, T_COLON)) {
            P->cur++;
            is_slice = true;
        } else {
            x = parse_expression(P);
            if (!x) return NULL;
            if (is(P, T_COLON)) {
                P->cur++;
                is_slice = true;
            }
        }
        if (ns >= 3) {
            p_err(P, "expected 0-3 arguments for a slice expression%s", "");
            return NULL;
        }
        sl[ns++] = x;
    }
    if (ns == 0) {
        p_err(P, "expected at least one argument for a member or slice expression%s", "");
        return NULL;
    }
    if (!is_slice) return sl[0];
    jnode *s = new_node(P, N_SLICE, pos);
    if (!s) return NULL;
    s->a = sl[0];
    s->b = sl[1];
    s->c = sl[2];
    return s;
}

static jnode *parse_member(parser *P, jnode *object) {
    while (object && (is(P, T_DOT) || is(P, T_OPEN_SQUARE))) {
        const jtok *op = &P->t[P->cur++];
        jnode *m = new_node(P, N_MEMBER, op->pos);
        if (!m) return NULL;
        m->a = object;
        if (op->type == T_OPEN_SQUARE) {
            m->negate = true; /* computed */
            if (!(m->b = parse_member_args(P, op->pos)) || !expect(P, T_CLOSE_SQUARE)) return NULL;
        } else {
            size_t at = P->cur;
            if (!(m->b = parse_primary(P))) return NULL;
            if (m->b->kind != N_IDENT && m->b->kind != N_INT) {
                P->cur = at;
                p_err(P, "expected an identifier or integer after '.'%s", "");
                return NULL;
            }
        }
        object = m;
    }
    return object;
}

static jnode *parse_call(parser *P, jnode *callee) {
    /* errors of a call point at the function's name when it has one */
    size_t pos = callee->kind == N_IDENT || P->cur >= P->n ? callee->pos : P->t[P->cur].pos;
    jnode *c = new_node(P, N_CALL, pos);
    if (!c) return NULL;
    c->a = callee;
    if (!parse_args(P, &c->list, false)) return NULL;
    jnode *x = parse_member(P, c);
    if (x && is(P, T_OPEN_PAREN)) x = parse_call(P, x);
    return x;
}

static jnode *parse_call_member(parser *P) {
    jnode *m = parse_member(P, parse_primary(P));
    if (m && is(P, T_OPEN_PAREN)) return parse_call(P, m);
    return m;
}

static jnode *parse_unary_sign(parser *P) {
    if (P->cur < P->n) {
        const jtok *tk = &P->t[P->cur];
        if ((tk->type == T_UNARY || tk->type == T_ADD) && (tok_is(tk, "-") || tok_is(tk, "+"))) {
            P->cur++;
            if (!enter(P)) return NULL;
            jnode *u = new_node(P, N_UNARY, tk->pos);
            if (u) {
                u->op = tok_is(tk, "-") ? OP_SUB : OP_ADD;
                if (!(u->a = parse_unary_sign(P))) u = NULL;
            }
            P->depth--;
            return u;
        }
    }
    return parse_call_member(P);
}

static jnode *parse_filter(parser *P) {
    jnode *operand = parse_unary_sign(P);
    while (operand && is(P, T_PIPE)) {
        size_t pos = P->t[P->cur].pos;
        P->cur++;
        size_t at = P->cur;
        jnode *f = parse_primary(P);
        if (!f) return NULL;
        if (f->kind != N_IDENT) {
            P->cur = at;
            p_err(P, "expected an identifier for the filter%s", "");
            return NULL;
        }
        if (is(P, T_OPEN_PAREN) && !(f = parse_call(P, f))) return NULL;
        jnode *x = new_node(P, N_FILTER, pos);
        if (!x) return NULL;
        x->a = operand;
        x->b = f;
        operand = x;
    }
    return operand;
}

static jnode *parse_test(parser *P) {
    jnode *operand = parse_filter(P);
    while (operand && is_ident(P, "is")) {
        P->cur++;
        bool neg = is_ident(P, "not");
        if (neg) P->cur++;
        size_t at = P->cur;
        jnode *f = parse_primary(P);
        if (!f) return NULL;
        if (f->kind != N_IDENT) {
            P->cur = at;
            p_err(P, "expected an identifier for the test%s", "");
            return NULL;
        }
        jnode *x = new_node(P, N_TEST, f->pos);
        if (!x) return NULL;
        x->a = operand;
        x->s = f->s;
        x->n = f->n;
        x->negate = neg;
        operand = x;
    }
    return operand;
}

static jnode *binary(parser *P, const jtok *tk, jop op, jnode *l, jnode *r) {
    if (!l || !r) return NULL;
    jnode *x = new_node(P, N_BINARY, tk->pos);
    if (!x) return NULL;
    x->op = op;
    x->a = l;
    x->b = r;
    return x;
}

static jnode *parse_pow(parser *P) {
    jnode *l = parse_test(P);
    while (l && is(P, T_POW)) {
        const jtok *tk = &P->t[P->cur++];
        l = binary(P, tk, OP_POW, l, parse_test(P));
    }
    return l;
}

static jnode *parse_mul(parser *P) {
    jnode *l = parse_pow(P);
    while (l && is(P, T_MUL)) {
        const jtok *tk = &P->t[P->cur++];
        jop op = tok_is(tk, "*") ? OP_MUL : tok_is(tk, "/") ? OP_DIV : tok_is(tk, "//") ? OP_FLOORDIV : OP_MOD;
        l = binary(P, tk, op, l, parse_pow(P));
    }
    return l;
}

static jnode *parse_add(parser *P) {
    jnode *l = parse_mul(P);
    while (l && is(P, T_ADD)) {
        const jtok *tk = &P->t[P->cur++];
        jop op = tok_is(tk, "+") ? OP_ADD : tok_is(tk, "-") ? OP_SUB : OP_CONCAT;
        l = binary(P, tk, op, l, parse_mul(P));
    }
    return l;
}

static jnode *parse_cmp(parser *P) {
    jnode *l = parse_add(P);
    while (l) {
        const jtok *tk;
        jop op;
        if (is_ident2(P, "not", "in")) {
            tk = &P->t[P->cur];
            op = OP_NOT_IN;
            P->cur += 2;
        } else if (is_ident(P, "in")) {
            tk = &P->t[P->cur++];
            op = OP_IN;
        } else if (is(P, T_CMP)) {
            tk = &P->t[P->cur++];
            op = tok_is(tk, "==")   ? OP_EQ
                 : tok_is(tk, "!=") ? OP_NE
                 : tok_is(tk, "<")  ? OP_LT
                 : tok_is(tk, ">")  ? OP_GT
                 : tok_is(tk, "<=") ? OP_LE
                                    : OP_GE;
        } else {
            break;
        }
        l = binary(P, tk, op, l, parse_add(P));
    }
    return l;
}

static jnode *parse_not(parser *P) {
    jnode *right = NULL;
    while (is_ident(P, "not")) {
        const jtok *tk = &P->t[P->cur++];
        if (!enter(P)) return NULL;
        jnode *arg = parse_not(P);
        P->depth--;
        if (!arg) return NULL;
        right = new_node(P, N_UNARY, tk->pos);
        if (!right) return NULL;
        right->op = OP_NOT;
        right->a = arg;
    }
    return right ? right : parse_cmp(P);
}

static jnode *parse_and(parser *P) {
    jnode *l = parse_not(P);
    while (l && is_ident(P, "and")) {
        const jtok *tk = &P->t[P->cur++];
        l = binary(P, tk, OP_AND, l, parse_not(P));
    }
    return l;
}

static jnode *parse_or(parser *P) {
    jnode *l = parse_and(P);
    while (l && is_ident(P, "or")) {
        const jtok *tk = &P->t[P->cur++];
        l = binary(P, tk, OP_OR, l, parse_and(P));
    }
    return l;
}

static jnode *parse_if_expr(parser *P) {
    jnode *a = parse_or(P);
    if (a && is_ident(P, "if")) {
        size_t pos = P->t[P->cur].pos;
        P->cur++;
        jnode *test = parse_or(P);
        if (!test) return NULL;
        if (is_ident(P, "else")) {
            P->cur++;
            jnode *x = new_node(P, N_TERNARY, pos);
            if (!x) return NULL;
            x->a = test;
            x->b = a;
            if (!enter(P)) return NULL;
            x->c = parse_if_expr(P);
            P->depth--;
            return x->c ? x : NULL;
        }
        jnode *x = new_node(P, N_SELECT, pos);
        if (!x) return NULL;
        x->a = a;
        x->b = test;
        return x;
    }
    return a;
}

static jnode *parse_expression(parser *P) {
    if (!enter(P)) return NULL;
    jnode *x = parse_if_expr(P);
    P->depth--;
    return x;
}

/* Parses statements into body until one of the named statements starts. */
static bool parse_body(parser *P, jnodes *body, const char *a, const char *b, const char *c, const char *what,
                       size_t open_pos) {
    while (!is_stmt(P, a, b, c)) {
        if (eof(P)) {
            p_err_at(P, open_pos, "unclosed block: expected {%% %s %%} before the end of the template", what);
            return false;
        }
        jnode *x = parse_any(P);
        if (!x || !nl_push(P, body, x)) return false;
    }
    return true;
}

/* pos: the if / elif keyword; open_pos: its '{%' (for unclosed blocks) */
static jnode *parse_if_stmt(parser *P, size_t pos, size_t open_pos) {
    jnode *x = new_node(P, N_IF, pos);
    if (!x || !(x->a = parse_expression(P)) || !expect(P, T_CLOSE_STMT)) return NULL;
    if (!parse_body(P, &x->body, "elif", "else", "endif", "endif", open_pos)) return NULL;
    if (is_stmt(P, "elif", NULL, NULL)) {
        size_t eopen = P->t[P->cur].pos, epos = P->t[P->cur + 1].pos;
        P->cur += 2;
        jnode *e = parse_if_stmt(P, epos, eopen);
        if (!e || !nl_push(P, &x->alt, e)) return NULL;
    } else if (is_stmt(P, "else", NULL, NULL)) {
        P->cur += 2;
        if (!expect(P, T_CLOSE_STMT)) return NULL;
        if (!parse_body(P, &x->alt, "endif", NULL, NULL, "endif", open_pos)) return NULL;
    }
    return x;
}

static jnode *parse_statement(parser *P) {
    size_t open_pos = P->t[P->cur].pos;
    if (!expect(P, T_OPEN_STMT)) return NULL;
    if (!is(P, T_IDENT)) {
        if (eof(P))
            p_err(P, "unexpected end of template after '{%%'%s", "");
        else
            p_err(P, "expected a statement name after '{%%'%s", "");
        return NULL;
    }
    const jtok *nm = &P->t[P->cur];
    size_t pos = nm->pos;
    jnode *x = NULL;
    if (tok_is(nm, "set")) {
        P->cur++;
        x = new_node(P, N_SET, pos);
        if (!x || !(x->a = parse_seq(P, false))) return NULL;
        if (is(P, T_EQUALS)) {
            P->cur++;
            if (!(x->b = parse_seq(P, false))) return NULL;
        } else {
            if (!expect(P, T_CLOSE_STMT)) return NULL;
            if (!parse_body(P, &x->body, "endset", NULL, NULL, "endset", open_pos)) return NULL;
            P->cur++;
            if (!expect_ident(P, "endset")) return NULL;
        }
        if (!expect(P, T_CLOSE_STMT)) return NULL;
    } else if (tok_is(nm, "if")) {
        P->cur++;
        if (!(x = parse_if_stmt(P, pos, open_pos))) return NULL;
        if (!expect(P, T_OPEN_STMT) || !expect_ident(P, "endif") || !expect(P, T_CLOSE_STMT)) return NULL;
    } else if (tok_is(nm, "macro")) {
        P->cur++;
        x = new_node(P, N_MACRO, pos);
        size_t at = P->cur;
        if (!x || !(x->a = parse_primary(P))) return NULL;
        if (x->a->kind != N_IDENT) {
            P->cur = at;
            p_err(P, "expected an identifier after 'macro'%s", "");
            return NULL;
        }
        if (!parse_args(P, &x->list2, true) || !expect(P, T_CLOSE_STMT)) return NULL;
        if (!parse_body(P, &x->body, "endmacro", NULL, NULL, "endmacro", open_pos)) return NULL;
        if (!expect(P, T_OPEN_STMT) || !expect_ident(P, "endmacro") || !expect(P, T_CLOSE_STMT)) return NULL;
    } else if (tok_is(nm, "for")) {
        P->cur++;
        x = new_node(P, N_FOR, pos);
        size_t at = P->cur;
        if (!x || !(x->a = parse_seq(P, true))) return NULL;
        if (x->a->kind != N_IDENT && x->a->kind != N_TUPLE) {
            P->cur = at;
            p_err(P, "expected an identifier or tuple for the loop variable%s", "");
            return NULL;
        }
        if (!is_ident(P, "in")) {
            p_err(P, "expected 'in' after the loop variable%s", "");
            return NULL;
        }
        P->cur++;
        if (!(x->b = parse_expression(P)) || !expect(P, T_CLOSE_STMT)) return NULL;
        if (!parse_body(P, &x->body, "endfor", "else", NULL, "endfor", open_pos)) return NULL;
        if (is_stmt(P, "else", NULL, NULL)) {
            P->cur += 2;
            if (!expect(P, T_CLOSE_STMT)) return NULL;
            if (!parse_body(P, &x->alt, "endfor", NULL, NULL, "endfor", open_pos)) return NULL;
        }
        if (!expect(P, T_OPEN_STMT) || !expect_ident(P, "endfor") || !expect(P, T_CLOSE_STMT)) return NULL;
    } else if (tok_is(nm, "call")) {
        P->cur++;
        x = new_node(P, N_CALLBLOCK, pos);
        if (!x) return NULL;
        if (is(P, T_OPEN_PAREN) && !parse_args(P, &x->list2, true)) return NULL;
        size_t at = P->cur;
        jnode *callee = parse_primary(P);
        if (!callee) return NULL;
        if (callee->kind != N_IDENT) {
            P->cur = at;
            p_err(P, "expected an identifier after 'call'%s", "");
            return NULL;
        }
        jnode *c = new_node(P, N_CALL, callee->pos);
        if (!c) return NULL;
        c->a = callee;
        if (!parse_args(P, &c->list, false) || !expect(P, T_CLOSE_STMT)) return NULL;
        x->a = c;
        if (!parse_body(P, &x->body, "endcall", NULL, NULL, "endcall", open_pos)) return NULL;
        if (!expect(P, T_OPEN_STMT) || !expect_ident(P, "endcall") || !expect(P, T_CLOSE_STMT)) return NULL;
    } else if (tok_is(nm, "break") || tok_is(nm, "continue")) {
        P->cur++;
        x = new_node(P, tok_is(nm, "break") ? N_BREAK : N_CONTINUE, pos);
        if (!x || !expect(P, T_CLOSE_STMT)) return NULL;
    } else if (tok_is(nm, "filter")) {
        P->cur++;
        x = new_node(P, N_FILTERBLOCK, pos);
        if (!x || !(x->a = parse_primary(P))) return NULL;
        if (x->a->kind == N_IDENT && is(P, T_OPEN_PAREN) && !(x->a = parse_call(P, x->a))) return NULL;
        if (!expect(P, T_CLOSE_STMT)) return NULL;
        if (!parse_body(P, &x->body, "endfilter", NULL, NULL, "endfilter", open_pos)) return NULL;
        if (!expect(P, T_OPEN_STMT) || !expect_ident(P, "endfilter") || !expect(P, T_CLOSE_STMT)) return NULL;
    } else {
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)EMBER_MIN(nm->n, 60), nm->s);
        p_err(P, "unknown statement '%s'", name);
        return NULL;
    }
    return x;
}

static jnode *parse_any(parser *P) {
    if (!enter(P)) return NULL;
    const jtok *tk = &P->t[P->cur];
    jnode *x = NULL;
    switch (tk->type) {
    case T_COMMENT:
        x = new_node(P, N_COMMENT, tk->pos);
        P->cur++;
        break;
    case T_TEXT:
        x = new_node(P, N_TEXT, tk->pos);
        if (x) {
            x->s = tk->s;
            x->n = tk->n;
        }
        P->cur++;
        break;
    case T_OPEN_STMT:
        x = parse_statement(P);
        break;
    case T_OPEN_EXPR:
        P->cur++;
        x = parse_expression(P);
        if (x && !expect(P, T_CLOSE_EXPR)) x = NULL;
        break;
    default:
        p_err(P, "unexpected %s", tok_name(tk->type));
        break;
    }
    P->depth--;
    return x;
}

/* ---- which macros read kwargs / varargs (the reference's analysis) ---- */
typedef struct special_scan {
    bool decl_kwargs, decl_varargs;
    bool acc_kwargs, acc_varargs;
    int depth;
} special_scan;

static void sp_declare(special_scan *s, const jnode *x) {
    if (!x) return;
    if (x->kind == N_IDENT) {
        if (x->n == 6 && memcmp(x->s, "kwargs", 6) == 0) s->decl_kwargs = true;
        if (x->n == 7 && memcmp(x->s, "varargs", 7) == 0) s->decl_varargs = true;
    } else if (x->kind == N_TUPLE) {
        for (size_t i = 0; i < x->list.n; i++) sp_declare(s, x->list.v[i]);
    }
}

static void sp_visit(special_scan *s, const jnode *x);
static void sp_visit_list(special_scan *s, const jnodes *l) {
    for (size_t i = 0; i < l->n; i++) sp_visit(s, l->v[i]);
}
static void sp_params(special_scan *s, const jnodes *params) {
    for (size_t i = 0; i < params->n; i++) {
        const jnode *p = params->v[i];
        jnode tmp;
        memset(&tmp, 0, sizeof tmp);
        tmp.kind = N_IDENT;
        tmp.s = p->s;
        tmp.n = p->n;
        sp_declare(s, &tmp);
    }
    for (size_t i = 0; i < params->n; i++)
        if (params->v[i]->kind == N_KWARG) sp_visit(s, params->v[i]->b);
}

static void sp_visit(special_scan *s, const jnode *x) {
    if (!x || s->depth > 10000) return;
    s->depth++;
    switch (x->kind) {
    case N_FOR:
        sp_declare(s, x->a);
        if (x->b && x->b->kind == N_SELECT) {
            sp_visit(s, x->b->a);
            sp_visit_list(s, &x->body);
            sp_visit_list(s, &x->alt);
            sp_visit(s, x->b->b);
        } else {
            sp_visit(s, x->b);
            sp_visit_list(s, &x->body);
            sp_visit_list(s, &x->alt);
        }
        break;
    case N_SET:
        sp_declare(s, x->a);
        sp_visit(s, x->b);
        sp_visit_list(s, &x->body);
        break;
    case N_MACRO:
        sp_params(s, &x->list2);
        sp_visit_list(s, &x->body);
        break;
    case N_CALLBLOCK:
        sp_visit(s, x->a);
        sp_params(s, &x->list2);
        sp_visit_list(s, &x->body);
        break;
    case N_FILTERBLOCK:
        sp_visit_list(s, &x->body);
        if (x->a && x->a->kind == N_CALL) sp_visit_list(s, &x->a->list);
        break;
    case N_IDENT:
        if (x->n == 6 && memcmp(x->s, "kwargs", 6) == 0 && !s->decl_kwargs) s->acc_kwargs = true;
        if (x->n == 7 && memcmp(x->s, "varargs", 7) == 0 && !s->decl_varargs) s->acc_varargs = true;
        break;
    case N_MEMBER:
        sp_visit(s, x->a);
        if (x->negate) sp_visit(s, x->b);
        break;
    case N_FILTER:
        sp_visit(s, x->a);
        if (x->b && x->b->kind == N_CALL) sp_visit_list(s, &x->b->list);
        break;
    case N_TEST:
        sp_visit(s, x->a);
        break;
    case N_SELECT:
        sp_visit(s, x->b);
        sp_visit(s, x->a);
        break;
    case N_KWARG:
        sp_visit(s, x->b);
        break;
    default:
        sp_visit(s, x->a);
        sp_visit(s, x->b);
        sp_visit(s, x->c);
        sp_visit_list(s, &x->list);
        sp_visit_list(s, &x->list2);
        sp_visit_list(s, &x->body);
        sp_visit_list(s, &x->alt);
        break;
    }
    s->depth--;
}

static void mark_specials(jnode *x, int depth) {
    if (!x || depth > 10000) return;
    if (x->kind == N_MACRO || x->kind == N_CALLBLOCK) {
        special_scan s;
        memset(&s, 0, sizeof s);
        jnode tmp;
        for (size_t i = 0; i < x->list2.n; i++) {
            memset(&tmp, 0, sizeof tmp);
            tmp.kind = N_IDENT;
            tmp.s = x->list2.v[i]->s;
            tmp.n = x->list2.v[i]->n;
            sp_declare(&s, &tmp);
        }
        sp_visit_list(&s, &x->body);
        x->uses_kwargs = s.acc_kwargs;
        x->uses_varargs = s.acc_varargs;
    }
    mark_specials(x->a, depth + 1);
    mark_specials(x->b, depth + 1);
    mark_specials(x->c, depth + 1);
    const jnodes *ls[4] = {&x->list, &x->list2, &x->body, &x->alt};
    for (int k = 0; k < 4; k++)
        for (size_t i = 0; i < ls[k]->n; i++) mark_specials(ls[k]->v[i], depth + 1);
}

/* Does `loop` appear anywhere other than as the object of loop.attr /
   loop[...]? (then each iteration needs its own loop object) */
static bool loop_escapes(const jnode *x, const jnode *parent, int depth) {
    if (!x || depth > 10000) return x != NULL;
    if (x->kind == N_IDENT && x->n == 4 && memcmp(x->s, "loop", 4) == 0)
        return !(parent && parent->kind == N_MEMBER && parent->a == x);
    if (loop_escapes(x->a, x, depth + 1) || loop_escapes(x->b, x, depth + 1) || loop_escapes(x->c, x, depth + 1))
        return true;
    const jnodes *ls[4] = {&x->list, &x->list2, &x->body, &x->alt};
    for (int k = 0; k < 4; k++)
        for (size_t i = 0; i < ls[k]->n; i++)
            if (loop_escapes(ls[k]->v[i], x, depth + 1)) return true;
    return false;
}

int jinja_parse(jinja_template *t, const jtok *toks, size_t ntoks, int max_nesting, ember_error *err) {
    parser P;
    memset(&P, 0, sizeof P);
    P.tpl = t;
    P.a = &t->arena;
    P.t = toks;
    P.n = ntoks;
    P.err = err;
    P.max_depth = max_nesting;
    while (P.cur < P.n) {
        jnode *x = parse_any(&P);
        if (!x) return P.rc ? P.rc : ember_err(err, EMBER_ERR_INTERNAL, "template: parser failed");
        if (!nl_push(&P, &t->body, x)) return P.rc;
    }
    for (size_t i = 0; i < t->body.n; i++) {
        mark_specials(t->body.v[i], 0);
        if (loop_escapes(t->body.v[i], NULL, 0)) t->loop_escapes = true;
    }
    return EMBER_OK;
}
