//! A reader of the Prometheus text format, small and strict enough for tests (the unit
//! tests here and the end-to-end tests scraping `/metrics`): one [`Sample`] per line that
//! is not a comment, labels unescaped.

/// One sample line: `name{label="value",…} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// Every sample of an exposition; a line that does not parse is reported as an error
/// naming it.
pub fn try_parse(text: &str) -> Result<Vec<Sample>, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| parse_line(l).ok_or_else(|| format!("not a sample line: {l:?}")))
        .collect()
}

/// [`try_parse`], panicking on a malformed line (tests).
pub fn parse(text: &str) -> Vec<Sample> {
    try_parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// The value of the one sample named `name` whose labels include all of `labels`
/// (`None` when there is none; the sum when several match).
pub fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let matching: Vec<f64> = samples
        .iter()
        .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(v)))
        .map(|s| s.value)
        .collect();
    (!matching.is_empty()).then(|| matching.iter().sum())
}

fn parse_line(line: &str) -> Option<Sample> {
    let (name_end, labels, rest) = match line.find('{') {
        Some(open) if line[..open].find(' ').is_none() => {
            let (labels, after) = parse_labels(&line[open + 1..])?;
            (open, labels, after)
        }
        _ => {
            let space = line.find(' ')?;
            (space, Vec::new(), &line[space..])
        }
    };
    let name = line[..name_end].to_string();
    let value_text = rest.split_whitespace().next()?;
    let value = match value_text {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse().ok()?,
    };
    let valid_name = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
    valid_name.then_some(Sample { name, labels, value })
}

/// `k="v",k2="v2"}` → the pairs and the text after the `}`.
fn parse_labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([',', ' ']);
        if let Some(rest) = s.strip_prefix('}') {
            return Some((labels, rest));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim().to_string();
        let mut chars = s[eq + 1..].char_indices();
        if chars.next()?.1 != '"' {
            return None;
        }
        let mut value = String::new();
        let mut escaped = false;
        let mut end = None;
        for (i, c) in chars {
            match (escaped, c) {
                (true, c) => {
                    value.push(if c == 'n' { '\n' } else { c });
                    escaped = false;
                }
                (false, '\\') => escaped = true,
                (false, '"') => {
                    end = Some(eq + 1 + i + 1);
                    break;
                }
                (false, c) => value.push(c),
            }
        }
        s = &s[end?..];
        labels.push((key, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_with_and_without_labels_are_read_and_comments_skipped() {
        let text = "# HELP a_total things\n# TYPE a_total counter\na_total 3\nb{x=\"1\",y=\"a \\\"q\\\"\"} 2.5\nc_bucket{le=\"+Inf\"} 7\n";
        let samples = parse(text);
        assert_eq!(samples.len(), 3);
        assert_eq!(value(&samples, "a_total", &[]), Some(3.0));
        assert_eq!(value(&samples, "b", &[("y", "a \"q\"")]), Some(2.5));
        assert_eq!(value(&samples, "c_bucket", &[("le", "+Inf")]), Some(7.0));
        assert_eq!(value(&samples, "b", &[("x", "2")]), None);
        assert!(try_parse("what is this").is_err());
    }
}
