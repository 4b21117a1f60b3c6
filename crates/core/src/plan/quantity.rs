//! Kubernetes resource quantities as values, so that `2000m` and `2`, or
//! `1Gi` and `1024Mi`, compare equal as the API server stores them. Pure.

/// An exact quantity: `mantissa × 10^exponent`, with no trailing zero in
/// the mantissa, so that equal values have equal forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    negative: bool,
    mantissa: u128,
    exponent: i32,
}

/// Mantissas longer than this are not compared as numbers (they would
/// overflow); the text is compared instead.
const MAX_DIGITS: usize = 24;

impl Quantity {
    /// Parses `<sign><digits>[.<digits>]<suffix>`, the suffix one of the
    /// binary (`Ki` … `Ei`), decimal SI (`n` … `E`) or exponent (`e3`, `E-2`)
    /// forms. Anything else is not a quantity.
    pub fn parse(text: &str) -> Option<Quantity> {
        let (negative, rest) = match text.as_bytes().first()? {
            b'-' => (true, &text[1..]),
            b'+' => (false, &text[1..]),
            _ => (false, text),
        };
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_end);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
            return None;
        }
        let digits = format!("{whole}{fraction}");
        let digits = digits.trim_start_matches('0');
        if digits.len() > MAX_DIGITS {
            return None;
        }
        let mut mantissa: u128 = if digits.is_empty() { 0 } else { digits.parse().ok()? };
        let mut exponent = -i32::try_from(fraction.len()).ok()?;
        match suffix {
            "" => {}
            "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => {
                let power = match suffix {
                    "Ki" => 10,
                    "Mi" => 20,
                    "Gi" => 30,
                    "Ti" => 40,
                    "Pi" => 50,
                    _ => 60,
                };
                mantissa = mantissa.checked_mul(1u128 << power)?;
            }
            "n" => exponent -= 9,
            "u" => exponent -= 6,
            "m" => exponent -= 3,
            "k" => exponent += 3,
            "M" => exponent += 6,
            "G" => exponent += 9,
            "T" => exponent += 12,
            "P" => exponent += 15,
            "E" => exponent += 18,
            exponent_form => {
                let power = exponent_form.strip_prefix(['e', 'E'])?;
                let unsigned = power.strip_prefix(['+', '-']).unwrap_or(power);
                if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) || unsigned.len() > 4 {
                    return None;
                }
                exponent = exponent.checked_add(power.parse::<i32>().ok()?)?;
            }
        }
        if mantissa == 0 {
            return Some(Quantity {
                negative: false,
                mantissa: 0,
                exponent: 0,
            });
        }
        while mantissa.is_multiple_of(10) {
            mantissa /= 10;
            exponent += 1;
        }
        Some(Quantity {
            negative,
            mantissa,
            exponent,
        })
    }
}

/// Whether two texts are the same quantity; false when either is not one.
pub fn same_quantity(a: &str, b: &str) -> bool {
    matches!((Quantity::parse(a), Quantity::parse(b)), (Some(a), Some(b)) if a == b)
}

/// Keys whose values are maps (or lists of maps) of quantities: container
/// `resources`, ResourceQuota `hard`, PersistentVolume `capacity`, pod
/// `overhead`, LimitRange `limits`; and `sizeLimit`, one quantity.
pub fn holds_quantities(key: &str) -> bool {
    matches!(
        key,
        "requests" | "limits" | "hard" | "capacity" | "overhead" | "sizeLimit"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_notations_people_write_compare_as_the_server_stores_them() {
        for (a, b) in [
            ("2000m", "2"),
            ("0.5", "500m"),
            (".5", "500m"),
            ("1Gi", "1024Mi"),
            ("1Ki", "1024"),
            ("1e3", "1k"),
            ("1E3", "1000"),
            ("1.5Gi", "1536Mi"),
            ("100M", "100000k"),
            ("0", "0m"),
            ("-0", "0"),
            ("+1", "1"),
            ("129000000", "129e6"),
            ("129M", "129e6"),
            ("250000u", "250m"),
            ("1000000n", "1m"),
            ("12e-3", "12m"),
        ] {
            assert!(same_quantity(a, b), "{a} = {b}");
            assert!(same_quantity(b, a), "{b} = {a}");
        }
    }

    #[test]
    fn different_amounts_and_non_quantities_are_different() {
        for (a, b) in [
            ("2", "2001m"),
            ("1Gi", "1G"),
            ("1Mi", "1M"),
            ("-1", "1"),
            ("1", "abc"),
            ("1x", "1"),
            ("", ""),
            (".", "0"),
            ("1.2.3", "1.2.3"),
            ("1e", "1"),
            ("1e99999", "1e99999"),
            ("1111111111111111111111111111111", "1111111111111111111111111111111"),
        ] {
            assert!(!same_quantity(a, b), "{a} != {b}");
        }
    }

    #[test]
    fn no_text_makes_parsing_panic() {
        for text in [
            "-",
            "+",
            "Ei",
            "9Ei",
            "999999999999999999999999Ei",
            "e",
            "1e-",
            "1e+",
            "1.e3",
            "\u{00e9}",
            "1\u{00e9}",
        ] {
            let _ = Quantity::parse(text);
        }
        assert!(
            Quantity::parse("999999999999999999999999Ei").is_none(),
            "overflow is not a quantity"
        );
    }
}
