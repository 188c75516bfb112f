//! Shapes shared by backends: where a config `reshape` or `dims` puts a tensor's elements.

/// Resolves a config `reshape`/`dims` target for a tensor of `elements` elements: the batch
/// dimension (if any) goes first, and one -1 in `target` takes what is left. `None` when the
/// target does not fit.
pub(crate) fn resolve_shape(
    elements: usize,
    batch: Option<i64>,
    target: &[i64],
) -> Option<Vec<i64>> {
    let mut shape: Vec<i64> = batch.into_iter().chain(target.iter().copied()).collect();
    let known: i64 = shape.iter().filter(|&&d| d >= 0).product();
    let elements = i64::try_from(elements).ok()?;
    let mut wildcards = shape.iter_mut().filter(|d| **d < 0);
    match (wildcards.next(), wildcards.next()) {
        (None, _) => {}
        (Some(d), None) => {
            if known == 0 || elements % known != 0 {
                return None;
            }
            *d = elements / known;
        }
        (Some(_), Some(_)) => return None,
    }
    (shape.iter().product::<i64>() == elements).then_some(shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_shape_fills_one_wildcard() {
        assert_eq!(resolve_shape(6, Some(2), &[]), None);
        assert_eq!(resolve_shape(2, Some(2), &[]), Some(vec![2]));
        assert_eq!(resolve_shape(6, Some(2), &[3]), Some(vec![2, 3]));
        assert_eq!(resolve_shape(6, Some(2), &[-1]), Some(vec![2, 3]));
        assert_eq!(resolve_shape(6, None, &[-1, 2]), Some(vec![3, 2]));
        assert_eq!(resolve_shape(6, None, &[-1, -1]), None);
        assert_eq!(resolve_shape(0, Some(0), &[-1]), None);
        assert_eq!(resolve_shape(0, Some(0), &[4]), Some(vec![0, 4]));
    }
}
