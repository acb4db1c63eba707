//! `from_variants!`: the `From` impls of an error enum whose variants each wrap one error type.

/// `From<T>` for an error enum whose variant `V` wraps a `T`: `from_variants!(Enum: T => V, …)`.
macro_rules! from_variants {
    ($enum:ident: $($t:ty => $v:ident),* $(,)?) => {$(
        impl From<$t> for $enum {
            fn from(e: $t) -> Self {
                $enum::$v(e)
            }
        }
    )*};
}

pub(crate) use from_variants;
