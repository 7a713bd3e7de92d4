//! Output sizes of convolutions.

/// Size of one spatial output dimension, or `None` when the kernel does not fit.
pub fn conv_output_size(
    input: i64,
    kernel: i64,
    stride: i64,
    padding: i64,
    dilation: i64,
) -> Option<i64> {
    if stride <= 0 || dilation <= 0 || padding < 0 || kernel <= 0 {
        return None;
    }
    let span = dilation * (kernel - 1) + 1;
    let padded = input + 2 * padding;
    (padded >= span).then(|| (padded - span) / stride + 1)
}

/// Sizes of `conv{n}d(input, weight, stride, padding, dilation, groups)` with input
/// `[N, C_in, *spatial]` (batched) and weight `[C_out, C_in / groups, *kernel]`; `None` when
/// the shapes do not fit together (torch raises; the caller lets FakeTensorMode say how).
pub fn conv_output_sizes(
    input: &[i64],
    weight: &[i64],
    stride: &[i64],
    padding: &[i64],
    dilation: &[i64],
    groups: i64,
) -> Option<Vec<i64>> {
    let spatial = input.len().checked_sub(2)?;
    if spatial == 0 || weight.len() != input.len() || groups <= 0 {
        return None;
    }
    if [stride.len(), padding.len(), dilation.len()] != [spatial; 3] {
        return None;
    }
    if input[1] != weight[1] * groups || weight[0] % groups != 0 {
        return None;
    }
    let mut out = vec![input[0], weight[0]];
    for d in 0..spatial {
        out.push(conv_output_size(
            input[2 + d],
            weight[2 + d],
            stride[d],
            padding[d],
            dilation[d],
        )?);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resnet_stem() {
        // 7x7 stride 2 padding 3 on 224: 112.
        assert_eq!(
            conv_output_sizes(
                &[1, 3, 224, 224],
                &[64, 3, 7, 7],
                &[2, 2],
                &[3, 3],
                &[1, 1],
                1
            )
            .unwrap(),
            vec![1, 64, 112, 112]
        );
    }

    #[test]
    fn depthwise_and_mismatch() {
        assert_eq!(
            conv_output_sizes(&[1, 8, 5, 5], &[8, 1, 3, 3], &[1, 1], &[1, 1], &[1, 1], 8).unwrap(),
            vec![1, 8, 5, 5]
        );
        assert!(
            conv_output_sizes(&[1, 8, 5, 5], &[8, 2, 3, 3], &[1, 1], &[1, 1], &[1, 1], 1).is_none()
        );
        assert!(
            conv_output_sizes(&[1, 8, 2, 2], &[8, 8, 3, 3], &[1, 1], &[0, 0], &[1, 1], 1).is_none()
        );
    }
}
