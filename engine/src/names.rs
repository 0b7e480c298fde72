//! The names settings go by on the command line and in config files.

/// `FromStr` and `Display` for an enum of choices, from one list of its variants' names. An
/// unknown name is refused with what the setting is and the names it takes:
/// `unknown selector 'x' (tokens, riders, pages)`.
macro_rules! named_choices {
    ($kind:ty, $what:literal, { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $kind {
            /// Every name the setting takes, in order.
            pub const NAMES: &'static [&'static str] = &[$($name),+];
        }

        impl std::str::FromStr for $kind {
            type Err = String;

            fn from_str(s: &str) -> std::result::Result<Self, String> {
                match s {
                    $($name => Ok(Self::$variant),)+
                    other => Err(format!(concat!("unknown ", $what, " '{}' (", named_choices!(@list $($name),+), ")"), other)),
                }
            }
        }

        impl std::fmt::Display for $kind {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(match self {
                    $(Self::$variant => $name,)+
                })
            }
        }
    };
    (@list $first:literal $(, $rest:literal)*) => {
        concat!($first $(, ", ", $rest)*)
    };
}

#[cfg(test)]
mod tests {
    #[derive(Debug, PartialEq)]
    enum Fruit {
        Apple,
        Pear,
    }
    named_choices!(Fruit, "fruit", { Apple => "apple", Pear => "pear" });

    #[test]
    fn names_parse_print_and_refuse_with_the_choices() {
        assert_eq!("pear".parse::<Fruit>(), Ok(Fruit::Pear));
        assert_eq!(Fruit::Apple.to_string(), "apple");
        assert_eq!("plum".parse::<Fruit>(), Err("unknown fruit 'plum' (apple, pear)".to_string()));
        assert_eq!(Fruit::NAMES, ["apple", "pear"]);
    }
}
