# Prints "LINES FILE:LINE" for each function body (a top-level "{" after ")" to
# its "}") longer than max; strings, characters, comments and preprocessor
# lines do not count as braces.
FNR == 1 { depth = 0; incom = 0; last = ""; start = 0 }
{
    line = $0
    if (!incom && line ~ /^[ \t]*#/) next
    n = length(line); i = 1
    while (i <= n) {
        c = substr(line, i, 1); c2 = substr(line, i, 2)
        if (incom) { if (c2 == "*/") { incom = 0; i += 2 } else i++; continue }
        if (c2 == "/*") { incom = 1; i += 2; continue }
        if (c2 == "//") break
        if (c == "\"" || c == "'") {
            q = c; i++
            while (i <= n && substr(line, i, 1) != q) { if (substr(line, i, 1) == "\\") i++; i++ }
            i++; last = q; continue
        }
        if (c == "{") { if (depth == 0 && last == ")") start = FNR; depth++ }
        else if (c == "}") {
            depth--
            if (depth == 0 && start) { if (FNR - start + 1 > max) print FNR - start + 1, FILENAME ":" start; start = 0 }
        }
        if (c !~ /[ \t]/) last = c
        i++
    }
}
