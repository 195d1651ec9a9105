@group(0)
@binding(0)
var<storage, read_write> buffer_0_global: array<vec4<f32>>;

@group(0)
@binding(1)
var<storage, read_write> buffer_1_global: array<vec4<f32>>;

struct info_st {
   scalars_u32: array<u32, 4>,
   static_meta: array<u32, 4>,
}

@group(0)
@binding(2)
var<storage, read> info: info_st;

const WORKGROUP_SIZE_X = 128u;
const WORKGROUP_SIZE_Y = 1u;
const WORKGROUP_SIZE_Z = 1u;

@compute
@workgroup_size(128, 1, 1)
fn k_mean_finish_n_4(
    @builtin(global_invocation_id) global_id: vec3<u32>,
    @builtin(num_workgroups) num_workgroups: vec3<u32>,
) {
let id = (u32(global_id.z) * u32(num_workgroups.x) * u32(WORKGROUP_SIZE_X) * u32(num_workgroups.y) * u32(WORKGROUP_SIZE_Y)) + (u32(global_id.y) * u32(num_workgroups.x) * u32(WORKGROUP_SIZE_X)) + u32(global_id.x);

var l_mut_15: vec4<bool>;
var l_mut_7: vec4<f32>;
let l_0 = id < info.scalars_u32[2];
if l_0 {
let l_1 = id / u32(16);
let l_2 = id % u32(16);
let l_3 = l_1 * info.scalars_u32[1];
let l_4 = l_3 * u32(16);
let l_5 = l_4 + l_2;
let l_6 = vec4<f32>(f32(0.0));
l_mut_7 = l_6;

for (var l_mut_8: u32 = u32(0); l_mut_8 < info.scalars_u32[1]; l_mut_8++) {
let l_9 = l_mut_8 * u32(16);
let l_10 = l_5 + l_9;
let l_11 = buffer_0_global[l_10];
l_mut_7 = l_mut_7 + l_11;
}
let l_12 = f32(info.scalars_u32[0]);
let l_13 = vec4<f32>(l_12);
let l_14 = vec4<f32>(f32(0.0));
l_mut_15 = l_13 > l_14;
let l_16 = l_mut_7 / l_13;
let l_17 = vec4<f32>(f32(0.0));
let l_18 = select(l_17, l_16, l_mut_15);
buffer_1_global[id] = l_18;
}
}
